//! `gpu-dra kubelet-plugin`: the composition of backend, claims, CDI, checkpoint, kubelet
//! sockets and API-server publishing into the running driver.

pub mod simhost;
