//! Generated protobuf messages, servers and clients, one module per wire package. The package
//! names are fixed by the kubelet; the module names are ours.

/// `pluginregistration`: the kubelet's plugin watcher protocol.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1`: prepare/unprepare, Kubernetes 1.34 and later.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1`: the same calls without `share_id`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// `v1alpha1`: device health streaming for kubelets 1.34 to 1.36.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// `v1`: device health streaming for kubelets 1.37 and later.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod health_v1 {
    tonic::include_proto!("v1");
}
