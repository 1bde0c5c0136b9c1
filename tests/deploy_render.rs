//! The chart as `helm template` renders it for the default (real GPUs) and sim values: the
//! objects, the RBAC rules, the DaemonSets' mounts, env, probes and security. Skipped with a
//! notice when helm is absent; `.ci/run` installs it.

mod deploy_support;

use std::collections::BTreeMap;

use deploy_support::{chart_dir, render_chart, tool, yaml_file};
use serde_json::{Value, json};

fn sim_values() -> String {
    chart_dir().join("values-sim.yaml").display().to_string()
}

fn kinds(objects: &[Value]) -> Vec<String> {
    let mut kinds: Vec<String> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_string())
        .collect();
    kinds.sort();
    kinds
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn container(daemonset: &Value) -> &Value {
    &daemonset["spec"]["template"]["spec"]["containers"][0]
}

/// The plugin container's env entries by name ([`deploy_support::container_env`]).
fn env(daemonset: &Value) -> BTreeMap<String, String> {
    deploy_support::container_env(container(daemonset))
}

/// The plugin container's hostPath mounts: (host path, its volumeMount).
fn host_path_mounts(daemonset: &Value) -> Vec<(String, Value)> {
    let spec = &daemonset["spec"]["template"]["spec"];
    let volumes: BTreeMap<&str, &str> = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| Some((v["name"].as_str()?, v["hostPath"]["path"].as_str()?)))
        .collect();
    container(daemonset)["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| Some((volumes.get(m["name"].as_str()?)?.to_string(), m.clone())))
        .collect()
}

/// Host paths mounted into the plugin container: host path → (mount path, propagation).
fn host_mounts(daemonset: &Value) -> BTreeMap<String, (String, String)> {
    host_path_mounts(daemonset)
        .into_iter()
        .map(|(host, m)| {
            let path = m["mountPath"].as_str().unwrap().to_string();
            let propagation = m["mountPropagation"].as_str().unwrap_or("None").to_string();
            (host, (path, propagation))
        })
        .collect()
}

#[test]
fn default_values_render_the_plugin_rbac_policy_and_classes() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(&helm, &[]);
    // The plugin's role and binding, then gpu-dra doctor's read-only ones.
    let want = [
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "DaemonSet",
        "DeviceClass",
        "DeviceClass",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    assert_eq!(kinds(&objects), want);
}

#[test]
fn cluster_role_grants_exactly_what_the_plugin_calls() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(&helm, &[]);
    let role = of_kind(&objects, "ClusterRole")[0];
    let want = json!([
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
         "verbs": ["update"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
         "verbs": ["associated-node:update"], "resourceNames": ["gpu.nvidia.com"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["list", "create", "update", "delete"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]);
    assert_eq!(role["rules"], want);
    let binding = of_kind(&objects, "ClusterRoleBinding")[0];
    let want = json!([{"kind": "ServiceAccount", "name": "gpu-dra", "namespace": "gpu-dra"}]);
    assert_eq!(binding["subjects"], want);
}

#[test]
fn doctor_may_only_list_device_classes_and_admission_policies_as_the_plugins_account() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(&helm, &[]);
    let role = of_kind(&objects, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "gpu-dra-doctor")
        .expect("the doctor's ClusterRole");
    let want = json!([
        {"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["list"]},
        {"apiGroups": ["admissionregistration.k8s.io"],
         "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
         "verbs": ["list"]},
    ]);
    assert_eq!(role["rules"], want);
    let binding = of_kind(&objects, "ClusterRoleBinding")
        .into_iter()
        .find(|b| b["metadata"]["name"] == "gpu-dra-doctor")
        .expect("the doctor's ClusterRoleBinding");
    assert_eq!(binding["roleRef"]["name"], "gpu-dra-doctor");
    let want = json!([{"kind": "ServiceAccount", "name": "gpu-dra", "namespace": "gpu-dra"}]);
    assert_eq!(binding["subjects"], want);
}

#[test]
fn the_status_grant_names_the_charts_driver_and_nothing_else() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(&helm, &["--set", "driverName=gpu.example.com"]);
    let role = of_kind(&objects, "ClusterRole")[0];
    let named: Vec<&Value> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r.get("resourceNames").is_some())
        .collect();
    let want = json!({"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
                      "verbs": ["associated-node:update"], "resourceNames": ["gpu.example.com"]});
    assert_eq!(vec![&want], named);
}

#[test]
fn mig_profiles_value_reaches_the_plugin_as_its_env_var_and_is_split_by_default() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let profiles = |args: &[&str]| {
        let objects = render_chart(&helm, args);
        env(of_kind(&objects, "DaemonSet")[0])
            .get("GPU_DRA_MIG_PROFILES")
            .cloned()
    };
    // values.yaml says `migProfiles: split`, the plugin's own default as well.
    assert_eq!(Some("split".to_string()), profiles(&[]));
    assert_eq!(
        Some("all".to_string()),
        profiles(&["--set", "migProfiles=all"])
    );
    assert_eq!(
        Some("1g.10gb,3g.40gb,7g.80gb".to_string()),
        profiles(&["--set-string", "migProfiles=1g.10gb\\,3g.40gb\\,7g.80gb"])
    );
}

#[test]
fn slice_layout_value_reaches_the_plugin_as_its_env_var_and_is_absent_by_default() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let layout = |args: &[&str]| {
        let objects = render_chart(&helm, args);
        env(of_kind(&objects, "DaemonSet")[0])
            .get("GPU_DRA_SLICE_LAYOUT")
            .cloned()
    };
    assert_eq!(None, layout(&[]));
    assert_eq!(
        Some("by-profile".to_string()),
        layout(&["--set", "sliceLayout=by-profile"])
    );
}

#[test]
fn mig_attributes_value_reaches_the_plugin_as_its_env_var_and_is_absent_by_default() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let detail = |args: &[&str]| {
        let objects = render_chart(&helm, args);
        env(of_kind(&objects, "DaemonSet")[0])
            .get("GPU_DRA_MIG_ATTRIBUTES")
            .cloned()
    };
    assert_eq!(None, detail(&[]));
    assert_eq!(
        Some("full".to_string()),
        detail(&["--set", "migAttributes=full"])
    );
}

#[test]
fn admission_policy_applies_to_the_plugin_service_accounts_only() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(&helm, &[]);
    let policy = of_kind(&objects, "ValidatingAdmissionPolicy")[0];
    let want = json!([{"name": "is-this-driver-plugin", "expression":
        "request.userInfo.username in [ \"system:serviceaccount:gpu-dra:gpu-dra\"]"}]);
    assert_eq!(policy["spec"]["matchConditions"], want);
    // With ComputeDomains, their plugin publishes slices too, and is held to its node alike.
    let objects = render_chart(&helm, &["--set", "computeDomains.enabled=true"]);
    let policy = of_kind(&objects, "ValidatingAdmissionPolicy")
        .into_iter()
        .find(|p| p["metadata"]["name"] == "gpu-dra-own-node-slices")
        .expect("the slice policy");
    let want = json!([{"name": "is-this-driver-plugin", "expression":
        "request.userInfo.username in [ \"system:serviceaccount:gpu-dra:gpu-dra\", \"system:serviceaccount:gpu-dra:gpu-dra-compute-domain-plugin\"]"}]);
    assert_eq!(policy["spec"]["matchConditions"], want);
    let binding = of_kind(&objects, "ValidatingAdmissionPolicyBinding")[0];
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
}

#[test]
fn real_gpu_plugin_is_privileged_with_host_mounts_probes_and_downward_env() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(&helm, &[]);
    let daemonset = of_kind(&objects, "DaemonSet")[0];
    let plugin_dir = "/var/lib/kubelet/plugins/gpu.nvidia.com";
    let mount = |path: &str, propagation: &str| (path.to_string(), propagation.to_string());
    let want = BTreeMap::from([
        (plugin_dir.to_string(), mount(plugin_dir, "Bidirectional")),
        (
            "/var/lib/kubelet/plugins_registry".to_string(),
            mount("/var/lib/kubelet/plugins_registry", "None"),
        ),
        ("/var/run/cdi".to_string(), mount("/var/run/cdi", "None")),
        // Device metadata on a tmpfs next to the CDI specs (docs/device-metadata.md).
        (
            "/var/run/gpu-dra/dra-device-metadata".to_string(),
            mount("/var/run/gpu-dra/dra-device-metadata", "None"),
        ),
        ("/".to_string(), mount("/driver-root", "HostToContainer")),
        ("/dev".to_string(), mount("/host/dev", "HostToContainer")),
    ]);
    assert_eq!(host_mounts(daemonset), want);

    let env = env(daemonset);
    let got: Vec<(&str, Option<&str>)> = [
        "NODE_NAME",
        "POD_UID",
        "MALLOC_ARENA_MAX",
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "GPU_DRA_GPU_BACKEND",
        "GPU_DRA_PLUGIN_DIR",
        "GPU_DRA_DRIVER_ROOT",
        "GPU_DRA_HOST_DRIVER_ROOT",
        "GPU_DRA_DEV_ROOT",
        "GPU_DRA_METRICS_ADDR",
        "GPU_DRA_SHARED_GPUS",
        "GPU_DRA_SIM_NODE",
    ]
    .into_iter()
    .map(|name| (name, env.get(name).map(String::as_str)))
    .collect();
    let want = vec![
        ("NODE_NAME", Some("fieldRef:spec.nodeName")),
        ("POD_UID", Some("fieldRef:metadata.uid")),
        ("MALLOC_ARENA_MAX", Some("2")),
        ("MALLOC_MMAP_THRESHOLD_", Some("65536")),
        ("MALLOC_TRIM_THRESHOLD_", Some("1048576")),
        ("GPU_DRA_GPU_BACKEND", Some("nvml")),
        ("GPU_DRA_PLUGIN_DIR", Some(plugin_dir)),
        ("GPU_DRA_DRIVER_ROOT", Some("/driver-root")),
        ("GPU_DRA_HOST_DRIVER_ROOT", Some("/")),
        ("GPU_DRA_DEV_ROOT", Some("/host")),
        ("GPU_DRA_METRICS_ADDR", Some(":8080")),
        ("GPU_DRA_SHARED_GPUS", Some("off")),
        ("GPU_DRA_SIM_NODE", None),
    ];
    assert_eq!(got, want);

    let ctr = container(daemonset);
    let probes = (
        ctr["livenessProbe"]["httpGet"].clone(),
        ctr["readinessProbe"]["httpGet"].clone(),
        ctr["ports"][0]["name"].clone(),
        ctr["securityContext"]["privileged"].clone(),
        ctr["args"].clone(),
    );
    let want = (
        json!({"path": "/healthz", "port": "metrics"}),
        json!({"path": "/readyz", "port": "metrics"}),
        json!("metrics"),
        json!(true),
        json!(["kubelet-plugin"]),
    );
    assert_eq!(probes, want);
}

#[test]
fn sim_values_run_one_unprivileged_daemonset_per_preset_label() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(&helm, &["-f", &sim_values()]);
    type Row = (
        Value,
        String,
        String,
        Value,
        usize,
        Option<String>,
        Option<String>,
    );
    let got: Vec<Row> = of_kind(&objects, "DaemonSet")
        .into_iter()
        .map(|ds| {
            let env = env(ds);
            (
                ds["spec"]["template"]["spec"]["nodeSelector"].clone(),
                env["GPU_DRA_SIM_NODE"].clone(),
                env["GPU_DRA_SHARED_GPUS"].clone(),
                container(ds)["securityContext"]["privileged"].clone(),
                host_mounts(ds).len(),
                env.get("GPU_DRA_PASSTHROUGH").cloned(),
                env.get("GPU_DRA_FABRIC_MANAGER").cloned(),
            )
        })
        .collect();
    let row = |preset: &str, shared: &str, vm: bool| {
        let on = |yes: bool| yes.then(|| "true".to_string());
        (
            json!({"gpu-dra.dev/sim-preset": preset}),
            preset.to_string(),
            shared.to_string(),
            Value::Null,
            // plugin dir, registry dir, CDI root, device metadata dir: nothing from the host
            // for passthrough, whose tree the simulated node keeps itself
            4,
            on(vm),
            on(vm),
        )
    };
    let want = vec![
        row("dgx-h100", "off", false),
        row("dgx-a100", "off", false),
        row("l4-x4", "memory", false),
        // Passthrough and Fabric Manager only where the preset simulates them.
        row("hgx-h100-passthrough", "off", true),
        // vGPU likewise (its types below).
        row("hgx-h100-vgpu", "off", false),
    ];
    assert_eq!(got, want);
    let vgpu: Vec<Option<String>> = of_kind(&objects, "DaemonSet")
        .into_iter()
        .map(|ds| env(ds).get("GPU_DRA_VGPU_TYPES").cloned())
        .collect();
    assert_eq!(vgpu, [None, None, None, None, Some("H100-4C".to_string())]);
    let classes: Vec<&str> = of_kind(&objects, "DeviceClass")
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str())
        .collect();
    assert!(classes.contains(&"vfio.gpu.nvidia.com"), "{classes:?}");
    assert!(classes.contains(&"vgpu.gpu.nvidia.com"), "{classes:?}");
}

#[test]
fn sim_values_with_the_nvml_library_run_the_nvml_backend_over_the_simulated_library() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(
        &helm,
        &["-f", &sim_values(), "--set", "sim.nvmlLibrary=true"],
    );
    let got: Vec<Vec<Value>> = of_kind(&objects, "DaemonSet")
        .into_iter()
        .map(|ds| {
            let env = env(ds);
            [
                "GPU_DRA_GPU_BACKEND",
                "GPU_DRA_NVML_LIB",
                "GPU_DRA_SIM_NODE",
                "GPU_DRA_SIM_STATE_DIR",
                "GPU_DRA_SIMULATED_HOST",
                "GPU_DRA_GPU_MIG_POLICIES",
            ]
            .iter()
            .map(|k| env.get(*k).map_or(Value::Null, |v| json!(v)))
            .collect()
        })
        .collect();
    let row = |preset: &str, policies: Value| {
        vec![
            json!("nvml"),
            json!("/usr/lib/gpu-dra/libgpu_dra_nvml_sim.so"),
            json!(preset),
            json!("/var/lib/kubelet/plugins/gpu.nvidia.com/sim"),
            json!("true"),
            policies,
        ]
    };
    let all_dynamic = (0..8)
        .map(|i| format!("{i}=dynamic"))
        .collect::<Vec<_>>()
        .join(",");
    let want = vec![
        row("dgx-h100", json!(all_dynamic)),
        row("dgx-a100", Value::Null),
        row("l4-x4", Value::Null),
        row("hgx-h100-passthrough", json!(all_dynamic)),
        row("hgx-h100-vgpu", json!(all_dynamic)),
    ];
    assert_eq!(got, want);
}

#[test]
fn rendered_device_classes_are_the_repository_classes_with_chart_labels() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(&helm, &[]);
    let got: Vec<(Value, Value)> = of_kind(&objects, "DeviceClass")
        .into_iter()
        .map(|c| (c["metadata"]["name"].clone(), c["spec"].clone()))
        .collect();
    let file = |name: &str| yaml_file(&deploy_support::repo().join("device-classes").join(name));
    let want: Vec<(Value, Value)> = ["gpu.nvidia.com.yaml", "mig.nvidia.com.yaml"]
        .into_iter()
        .map(|name| {
            let class = file(name);
            (class["metadata"]["name"].clone(), class["spec"].clone())
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn toggles_remove_the_policy_and_a_device_class() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(
        &helm,
        &[
            "--set",
            "admissionPolicy.enabled=false",
            "--set",
            "deviceClasses.mig=false",
        ],
    );
    let want = [
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "DaemonSet",
        "DeviceClass",
        "ServiceAccount",
    ];
    assert_eq!(kinds(&objects), want);
}

/// Host paths mounted into the plugin container that are not the chart's passthrough-free
/// mounts: host path → (mount path, read-only).
fn passthrough_mounts(daemonset: &Value) -> BTreeMap<String, (String, bool)> {
    host_path_mounts(daemonset)
        .into_iter()
        .filter(|(_, m)| m["mountPath"].as_str().unwrap().starts_with("/host-root"))
        .map(|(host, m)| {
            let path = m["mountPath"].as_str().unwrap().to_string();
            (host, (path, m["readOnly"].as_bool().unwrap_or(false)))
        })
        .collect()
}

/// The plugin's passthrough settings: `GPU_DRA_PASSTHROUGH` (`--passthrough`) and
/// `GPU_DRA_HOST_ROOT` (`--host-root`), absent as `None`.
fn passthrough_env(daemonset: &Value) -> (Option<String>, Option<String>) {
    let env = env(daemonset);
    (
        env.get("GPU_DRA_PASSTHROUGH").cloned(),
        env.get("GPU_DRA_HOST_ROOT").cloned(),
    )
}

fn class_names(objects: &[Value]) -> Vec<String> {
    of_kind(objects, "DeviceClass")
        .into_iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn passthrough_off_renders_no_vfio_class_no_passthrough_env_and_no_host_root_mounts() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    // (The simulated values turn it on for their hgx-h100-passthrough preset only:
    // sim_values_run_one_unprivileged_daemonset_per_preset_label.)
    let sim_without_vms = [
        "-f".to_string(),
        sim_values(),
        "--set".to_string(),
        "sim.nodePresets={dgx-h100,dgx-a100}".to_string(),
    ];
    for extra in [vec![], sim_without_vms.to_vec()] {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let objects = render_chart(&helm, &extra);
        assert_eq!(class_names(&objects), ["gpu.nvidia.com", "mig.nvidia.com"]);
        for ds in of_kind(&objects, "DaemonSet") {
            assert_eq!(passthrough_env(ds), (None, None));
            assert_eq!(passthrough_mounts(ds), BTreeMap::new());
        }
    }
}

#[test]
fn passthrough_on_renders_the_vfio_class_the_flags_and_the_host_sys_dev_vfio_and_proc_mounts() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(&helm, &["--set", "passthrough.enabled=true"]);
    assert_eq!(
        class_names(&objects),
        ["gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"]
    );
    let file = yaml_file(&deploy_support::repo().join("device-classes/vfio.gpu.nvidia.com.yaml"));
    let rendered = of_kind(&objects, "DeviceClass")[2];
    assert_eq!(rendered["spec"], file["spec"]);
    assert_eq!(
        file["spec"]["selectors"][0]["cel"]["expression"],
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'"
    );

    let daemonset = of_kind(&objects, "DaemonSet")[0];
    assert_eq!(
        passthrough_env(daemonset),
        (Some("true".into()), Some("/host-root".into()))
    );
    // sysfs writable (bind/unbind, driver_override); the rest only read.
    let mount = |path: &str, read_only: bool| (path.to_string(), read_only);
    let want = BTreeMap::from([
        ("/sys".to_string(), mount("/host-root/sys", false)),
        ("/dev/vfio".to_string(), mount("/host-root/dev/vfio", true)),
        ("/proc".to_string(), mount("/host-root/proc", true)),
    ]);
    assert_eq!(passthrough_mounts(daemonset), want);
    // Real GPU nodes run privileged already; passthrough adds nothing to it.
    assert_eq!(
        container(daemonset)["securityContext"],
        json!({"privileged": true})
    );

    let iommufd = render_chart(
        &helm,
        &[
            "--set",
            "passthrough.enabled=true",
            "--set",
            "passthrough.iommufd=true",
        ],
    );
    let daemonset = of_kind(&iommufd, "DaemonSet")[0];
    assert_eq!(
        passthrough_mounts(daemonset).get("/dev/iommu"),
        Some(&mount("/host-root/dev/iommu", true))
    );
    let volume = daemonset["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["hostPath"]["path"] == "/dev/iommu")
        .unwrap();
    assert_eq!(volume["hostPath"]["type"], "CharDevice");
}

#[test]
fn passthrough_without_privileged_adds_only_sys_ptrace_to_the_dropped_capabilities() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(
        &helm,
        &[
            "--set",
            "passthrough.enabled=true",
            "--set",
            "kubeletPlugin.privileged=false",
        ],
    );
    let daemonset = of_kind(&objects, "DaemonSet")[0];
    assert_eq!(
        container(daemonset)["securityContext"],
        json!({
            "runAsUser": 0,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE"]},
        })
    );
    assert_eq!(passthrough_mounts(daemonset).len(), 3);
}

#[test]
fn passthrough_with_sim_values_sets_the_flag_but_mounts_nothing_from_the_host() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let sim = sim_values();
    let plain = render_chart(&helm, &["-f", &sim]);
    let objects = render_chart(&helm, &["-f", &sim, "--set", "passthrough.enabled=true"]);
    assert!(class_names(&objects).contains(&"vfio.gpu.nvidia.com".to_string()));
    let plain_sets = of_kind(&plain, "DaemonSet");
    let sets = of_kind(&objects, "DaemonSet");
    assert_eq!(sets.len(), plain_sets.len());
    for (ds, plain_ds) in sets.into_iter().zip(plain_sets) {
        // The simulated node's own tree is the plugin's default --host-root.
        assert_eq!(passthrough_env(ds), (Some("true".into()), None));
        assert_eq!(host_mounts(ds), host_mounts(plain_ds));
        assert_eq!(
            container(ds)["securityContext"],
            container(plain_ds)["securityContext"]
        );
    }
    // The NVML backend over the simulated library is told where the library keeps the tree.
    let objects = render_chart(
        &helm,
        &[
            "-f",
            &sim,
            "--set",
            "passthrough.enabled=true",
            "--set",
            "sim.nvmlLibrary=true",
        ],
    );
    for ds in of_kind(&objects, "DaemonSet") {
        let env = env(ds);
        assert_eq!(
            passthrough_env(ds),
            (
                Some("true".into()),
                Some(format!("{}/host-root", env["GPU_DRA_SIM_STATE_DIR"]))
            )
        );
        assert_eq!(passthrough_mounts(ds), BTreeMap::new());
    }
}

#[test]
fn helm_refuses_a_misspelt_value() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let chart = chart_dir();
    let output = std::process::Command::new(&helm)
        .args([
            "template",
            "x",
            chart.to_str().unwrap(),
            "--set",
            "logging.levle=debug",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("levle"),
        "{stderr}"
    );
}

/// Deserialises `object` as `T` and serialises it back: a field the API type does not have
/// (a typo, a wrong indentation level) is dropped on the way and shows up as a difference.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(object: &Value) -> Value {
    let typed: T = serde_json::from_value(object.clone())
        .unwrap_or_else(|e| panic!("{} {}: {e}", object["kind"], object["metadata"]["name"]));
    serde_json::to_value(typed).unwrap()
}

/// The paths where `want` and `got` differ (a field only one of them has, or different values).
fn differences(want: &Value, got: &Value, path: &str) -> Vec<String> {
    match (want, got) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter()
                .flat_map(|k| {
                    let (x, y) = (
                        a.get(k).unwrap_or(&Value::Null),
                        b.get(k).unwrap_or(&Value::Null),
                    );
                    differences(x, y, &format!("{path}.{k}"))
                })
                .collect()
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .flat_map(|(i, (x, y))| differences(x, y, &format!("{path}[{i}]")))
            .collect(),
        (a, b) if a == b => Vec::new(),
        (a, b) => vec![format!("{path}: rendered {a}, API type keeps {b}")],
    }
}

#[test]
fn every_rendered_object_is_exactly_its_kubernetes_api_type() {
    use k8s_openapi::api::admissionregistration::v1 as admission;
    use k8s_openapi::api::resource::v1 as resource;
    use k8s_openapi::api::{apps::v1 as apps, core::v1 as core, rbac::v1 as rbac};
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let sim = sim_values();
    // With ComputeDomains on too: the controller Deployment, its plugin and their RBAC.
    let on = ["--set", "computeDomains.enabled=true"];
    // With passthrough on: the VFIO class, the host-root mounts (and SYS_PTRACE unprivileged).
    let vfio = [
        "--set",
        "passthrough.enabled=true",
        "--set",
        "passthrough.iommufd=true",
    ];
    let runs = [
        vec![],
        vec!["-f", sim.as_str()],
        on.to_vec(),
        [on.as_slice(), &["-f", sim.as_str()]].concat(),
        vfio.to_vec(),
        [
            vfio.as_slice(),
            &["--set", "kubeletPlugin.privileged=false"],
        ]
        .concat(),
        [vfio.as_slice(), &["-f", sim.as_str()]].concat(),
        // With vGPU on: the vGPU class, its env and the host-root mounts.
        vec![
            "--set",
            "vgpu.types=H100-4C",
            "--set",
            "vgpu.compatibilityGroups=true",
            "--set",
            "partitionableDevicesType=true",
            "--set",
            "kubeletPlugin.privileged=false",
        ],
    ];
    for extra in runs {
        for object in render_chart(&helm, &extra) {
            let got = match object["kind"].as_str().unwrap() {
                "Deployment" => round_trip::<apps::Deployment>(&object),
                "Role" => round_trip::<rbac::Role>(&object),
                "RoleBinding" => round_trip::<rbac::RoleBinding>(&object),
                "DaemonSet" => round_trip::<apps::DaemonSet>(&object),
                "ServiceAccount" => round_trip::<core::ServiceAccount>(&object),
                "ClusterRole" => round_trip::<rbac::ClusterRole>(&object),
                "ClusterRoleBinding" => round_trip::<rbac::ClusterRoleBinding>(&object),
                "DeviceClass" => round_trip::<resource::DeviceClass>(&object),
                "ValidatingAdmissionPolicy" => {
                    round_trip::<admission::ValidatingAdmissionPolicy>(&object)
                }
                "ValidatingAdmissionPolicyBinding" => {
                    round_trip::<admission::ValidatingAdmissionPolicyBinding>(&object)
                }
                other => panic!("unexpected kind {other}"),
            };
            let what = format!("{} {}", object["kind"], object["metadata"]["name"]);
            assert_eq!(differences(&object, &got, &what), Vec::<String>::new());
        }
    }
}

#[test]
fn fabric_manager_values_reach_the_plugin_with_the_sockets_directory_only_when_enabled() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let fm_env = |args: &[&str]| {
        let objects = render_chart(&helm, args);
        let ds = of_kind(&objects, "DaemonSet")[0];
        let env: BTreeMap<String, String> = env(ds)
            .into_iter()
            .filter(|(k, _)| k.contains("FABRIC") || k.contains("FMPM"))
            .collect();
        let mounted = host_mounts(ds).contains_key("/run/nvidia-fabricmanager");
        (env, mounted)
    };
    let pairs = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!((BTreeMap::new(), false), fm_env(&[]), "off by default");
    assert_eq!(
        (
            pairs(&[
                ("GPU_DRA_FABRIC_MANAGER", "true"),
                (
                    "NVIDIA_FABRICMANAGER_UNIX_SOCKET",
                    "/run/nvidia-fabricmanager/socket"
                )
            ]),
            true
        ),
        fm_env(&["--set", "fabricManager.enabled=true"])
    );
    assert_eq!(
        (
            pairs(&[
                ("GPU_DRA_FABRIC_MANAGER", "true"),
                ("NVIDIA_FABRICMANAGER_ADDRESS", "10.0.0.7"),
                ("GPU_DRA_FMPM_PATH", "/driver-root/opt/fm/fmpm"),
            ]),
            false
        ),
        fm_env(&[
            "--set",
            "fabricManager.enabled=true",
            "--set",
            "fabricManager.address=10.0.0.7",
            "--set",
            "fabricManager.fmpmPath=/driver-root/opt/fm/fmpm",
        ]),
        "TCP: no socket mount"
    );
    let sim = sim_values();
    assert_eq!(
        (pairs(&[("GPU_DRA_FABRIC_MANAGER", "true")]), false),
        fm_env(&["-f", &sim, "--set", "fabricManager.enabled=true"]),
        "the sim uses its own simulated FM"
    );
}

/// The plugin's vGPU settings: `GPU_DRA_VGPU_TYPES`, `GPU_DRA_COMPATIBILITY_GROUPS`,
/// `GPU_DRA_PARTITIONABLE_DEVICES_TYPE` and `GPU_DRA_HOST_ROOT`, absent as `None`.
fn vgpu_env(daemonset: &Value) -> [Option<String>; 4] {
    let env = env(daemonset);
    [
        "GPU_DRA_VGPU_TYPES",
        "GPU_DRA_COMPATIBILITY_GROUPS",
        "GPU_DRA_PARTITIONABLE_DEVICES_TYPE",
        "GPU_DRA_HOST_ROOT",
    ]
    .map(|k| env.get(k).cloned())
}

#[test]
fn vgpu_off_renders_no_vgpu_class_no_vgpu_env_and_no_host_root_mounts() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(&helm, &[]);
    assert!(!class_names(&objects).contains(&"vgpu.gpu.nvidia.com".to_string()));
    let daemonset = of_kind(&objects, "DaemonSet")[0];
    assert_eq!(vgpu_env(daemonset), [None, None, None, None]);
    assert_eq!(passthrough_mounts(daemonset), BTreeMap::new());
}

#[test]
fn vgpu_types_reach_the_plugin_with_the_vgpu_class_and_the_host_root_mounts_passthrough_uses() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(&helm, &["--set", "vgpu.types=H100-4C\\,H100-10C"]);
    assert_eq!(
        class_names(&objects),
        ["gpu.nvidia.com", "mig.nvidia.com", "vgpu.gpu.nvidia.com"]
    );
    let file = yaml_file(&deploy_support::repo().join("device-classes/vgpu.gpu.nvidia.com.yaml"));
    assert_eq!(of_kind(&objects, "DeviceClass")[2]["spec"], file["spec"]);
    let daemonset = of_kind(&objects, "DaemonSet")[0];
    assert_eq!(
        vgpu_env(daemonset),
        [
            Some("H100-4C,H100-10C".into()),
            None,
            None,
            Some("/host-root".into())
        ]
    );
    assert_eq!(
        passthrough_env(daemonset).0,
        None,
        "vGPU is not --passthrough"
    );
    // sysfs writable (current_vgpu_type, mdev create/remove); /dev/vfio and /proc read only.
    let mount = |path: &str, read_only: bool| (path.to_string(), read_only);
    let want = BTreeMap::from([
        ("/sys".to_string(), mount("/host-root/sys", false)),
        ("/dev/vfio".to_string(), mount("/host-root/dev/vfio", true)),
        ("/proc".to_string(), mount("/host-root/proc", true)),
    ]);
    assert_eq!(passthrough_mounts(daemonset), want);
    // With passthrough on too: the same mounts once, both classes.
    let both = render_chart(
        &helm,
        &[
            "--set",
            "vgpu.types=H100-4C",
            "--set",
            "passthrough.enabled=true",
        ],
    );
    let daemonset = of_kind(&both, "DaemonSet")[0];
    assert_eq!(passthrough_mounts(daemonset), want);
    assert_eq!(
        class_names(&both),
        [
            "gpu.nvidia.com",
            "mig.nvidia.com",
            "vfio.gpu.nvidia.com",
            "vgpu.gpu.nvidia.com"
        ]
    );
    // Unprivileged, vGPU adds only SYS_PTRACE (the processes holding a GPU).
    let unprivileged = render_chart(
        &helm,
        &[
            "--set",
            "vgpu.types=H100-4C",
            "--set",
            "kubeletPlugin.privileged=false",
        ],
    );
    assert_eq!(
        container(of_kind(&unprivileged, "DaemonSet")[0])["securityContext"]["capabilities"],
        json!({"drop": ["ALL"], "add": ["SYS_PTRACE"]})
    );
}

#[test]
fn compatibility_groups_and_partitionable_devices_type_reach_the_plugin_as_their_env_vars() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(
        &helm,
        &[
            "--set",
            "vgpu.types=L40S-12Q\\,L40S-1B",
            "--set",
            "vgpu.compatibilityGroups=true",
            "--set",
            "partitionableDevicesType=true",
        ],
    );
    assert_eq!(
        vgpu_env(of_kind(&objects, "DaemonSet")[0]),
        [
            Some("L40S-12Q,L40S-1B".into()),
            Some("true".into()),
            Some("true".into()),
            Some("/host-root".into())
        ]
    );
    // partitionTypeAttribute needs no vGPU and mounts nothing.
    let alone = render_chart(&helm, &["--set", "partitionableDevicesType=true"]);
    let daemonset = of_kind(&alone, "DaemonSet")[0];
    assert_eq!(vgpu_env(daemonset), [None, None, Some("true".into()), None]);
    assert_eq!(passthrough_mounts(daemonset), BTreeMap::new());
}

#[test]
fn a_sim_preset_entry_sets_its_own_vgpu_and_the_nvml_library_is_pointed_at_the_simulated_tree() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let presets = "sim.nodePresets[0].preset=l40s-vgpu,sim.nodePresets[0].vgpu.types=L40S-12Q\\,L40S-1B,sim.nodePresets[0].vgpu.compatibilityGroups=true,sim.nodePresets[1].preset=l4-x4";
    for nvml in [false, true] {
        let objects = render_chart(
            &helm,
            &[
                "-f",
                &sim_values(),
                "--set",
                presets,
                "--set",
                &format!("sim.nvmlLibrary={nvml}"),
            ],
        );
        assert!(class_names(&objects).contains(&"vgpu.gpu.nvidia.com".to_string()));
        let sets = of_kind(&objects, "DaemonSet");
        let tree = nvml.then(|| "/var/lib/kubelet/plugins/gpu.nvidia.com/sim/host-root".into());
        assert_eq!(
            vgpu_env(sets[0]),
            [
                Some("L40S-12Q,L40S-1B".into()),
                Some("true".into()),
                None,
                tree
            ],
            "nvmlLibrary={nvml}"
        );
        assert_eq!(vgpu_env(sets[1]), [None, None, None, None]);
        for ds in sets {
            assert_eq!(
                passthrough_mounts(ds),
                BTreeMap::new(),
                "nothing from the host"
            );
        }
    }
}
