//! The chart with `computeDomains.enabled`: the values' schema, the controller Deployment, the
//! compute-domain kubelet plugin DaemonSet, their RBAC against the calls the controller's
//! source makes, and the two DeviceClasses. Rendering checks skip with a notice without helm
//! (`.ci/run` installs it).

mod deploy_support;

use std::collections::BTreeMap;
use std::fs;

use deploy_support::{chart_dir, render_chart, repo, tool, yaml_file};
use serde_json::{Value, json};

const ON: [&str; 2] = ["--set", "computeDomains.enabled=true"];

fn schema() -> jsonschema::Validator {
    let text = fs::read_to_string(chart_dir().join("values.schema.json")).unwrap();
    jsonschema::validator_for(&serde_json::from_str(&text).unwrap()).unwrap()
}

fn with(overrides: Value) -> Value {
    let mut values = yaml_file(&chart_dir().join("values.yaml"));
    for (k, v) in overrides.as_object().unwrap() {
        let base = values["computeDomains"].as_object_mut().unwrap();
        if k == "computeDomains" {
            for (kk, vv) in v.as_object().unwrap() {
                base.insert(kk.clone(), vv.clone());
            }
        }
    }
    values
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn named<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn compute_domains_are_off_by_default_and_their_values_are_schema_checked() {
    let defaults = yaml_file(&chart_dir().join("values.yaml"));
    assert_eq!(defaults["computeDomains"]["enabled"], json!(false));
    let v = schema();
    let bad = [
        json!({"computeDomains": {"enabeld": true}}),
        json!({"computeDomains": {"enabled": "yes"}}),
        json!({"computeDomains": {"controller": {"replicas": 0}}}),
        json!({"computeDomains": {"kubeletPlugin": {"nodeSelector": {"a": 1}}}}),
        json!({"computeDomains": {"bindingConditions": "yes"}}),
        json!({"computeDomains": {"bindingTimeout": "5 minutes"}}),
        json!({"computeDomains": {"bindingTimeout": "0"}}),
    ];
    let got: Vec<bool> = bad.iter().map(|o| v.is_valid(&with(o.clone()))).collect();
    assert_eq!(got, vec![false; bad.len()]);
    assert_eq!(
        defaults["computeDomains"]["bindingConditions"],
        json!(false)
    );
    assert_eq!(defaults["computeDomains"]["bindingTimeout"], json!("5m"));
    let good = with(
        json!({"computeDomains": {"enabled": true, "simPreset": "gb200-nvl72-node",
        "bindingConditions": true, "bindingTimeout": "90s",
        "controller": {"replicas": 2, "leaderElection": true,
                       "nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}}}),
    );
    let errors: Vec<String> = v.iter_errors(&good).map(|e| e.to_string()).collect();
    assert_eq!(errors, Vec::<String>::new());
}

#[test]
fn enabling_compute_domains_adds_the_controller_the_plugin_their_rbac_and_classes() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let count = |objects: &[Value]| {
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for o in objects {
            *kinds
                .entry(o["kind"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
        kinds
    };
    let off = count(&render_chart(&helm, &[]));
    let on = count(&render_chart(&helm, &ON));
    let added: BTreeMap<String, usize> = on
        .iter()
        .map(|(k, n)| (k.clone(), n - off.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let want: BTreeMap<String, usize> = [
        ("ClusterRole", 3),
        ("ClusterRoleBinding", 3),
        ("DaemonSet", 1),
        ("Deployment", 1),
        ("DeviceClass", 2),
        ("Role", 3),
        ("RoleBinding", 3),
        ("ServiceAccount", 3),
        ("ValidatingAdmissionPolicy", 1),
        ("ValidatingAdmissionPolicyBinding", 1),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_string(), n))
    .collect();
    assert_eq!(added, want);
}

#[test]
fn the_controller_runs_its_verb_with_the_namespace_image_and_daemon_account() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(
        &helm,
        &[
            "--set",
            "computeDomains.enabled=true",
            "--set",
            "image.tag=1.2.3",
        ],
    );
    let deployment = named(&objects, "Deployment", "gpu-dra-compute-domain-controller");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        (
            &pod["serviceAccountName"],
            &container["args"],
            &container["image"]
        ),
        (
            &json!("gpu-dra-compute-domain-controller"),
            &json!(["compute-domain-controller"]),
            &json!("gpu-dra:1.2.3")
        )
    );
    let want: BTreeMap<String, String> = [
        ("POD_NAMESPACE", "fieldRef:metadata.namespace"),
        ("POD_NAME", "fieldRef:metadata.name"),
        ("GPU_DRA_IMEX_SERVICE_ACCOUNT", "gpu-dra-imex-daemon"),
        ("GPU_DRA_LEADER_ELECTION", "true"),
        ("GPU_DRA_LOG_LEVEL", "info"),
        ("GPU_DRA_LOG_FORMAT", "text"),
        ("GPU_DRA_METRICS_ADDR", ":8080"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(deploy_support::container_env(container), want);
    // The env names are the controller's flags' (src/cli/compute_domain_controller.rs), but
    // POD_NAME, which it also reads as such (with POD_NAMESPACE: its own pod, whose image the
    // daemons run); the container's name is the one it looks for in that pod.
    // The log flags are the shared ones of src/cli/flags.rs.
    let main = fs::read_to_string(repo().join("src/cli/compute_domain_controller.rs")).unwrap()
        + &fs::read_to_string(repo().join("src/cli/flags.rs")).unwrap();
    for name in want.keys() {
        assert!(
            main.contains(&format!("env = \"{name}\"")),
            "{name} is no flag's env"
        );
    }
    assert!(main.contains("env(\"POD_NAMESPACE\").zip(env(\"POD_NAME\"))"));
    assert_eq!(
        container["name"],
        json!(gpu_dra::compute_domain::controller::CONTROLLER_CONTAINER)
    );
}

#[test]
fn the_compute_domain_plugin_takes_the_node_flags_with_its_own_plugin_dir() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let plugin_dir = "/var/lib/kubelet/plugins/compute-domain.nvidia.com";
    let sim = chart_dir().join("values-sim.yaml").display().to_string();
    let rows: Vec<(Value, Value)> = [ON.to_vec(), [ON.as_slice(), &["-f", sim.as_str()]].concat()]
        .iter()
        .map(|args| {
            let objects = render_chart(&helm, args);
            let ds = named(&objects, "DaemonSet", "gpu-dra-compute-domain-plugin");
            let pod = &ds["spec"]["template"]["spec"];
            (
                pod["containers"][0]["args"].clone(),
                pod["nodeSelector"].clone(),
            )
        })
        .collect();
    let args = |backend: &[&str]| {
        let mut a = vec![
            "compute-domain-plugin".to_string(),
            "--node-name=$(NODE_NAME)".to_string(),
            "--registry-dir=/var/lib/kubelet/plugins_registry".to_string(),
            format!("--plugin-dir={plugin_dir}"),
            format!("--state-dir={plugin_dir}"),
            "--cdi-root=/var/run/cdi".to_string(),
        ];
        a.extend(backend.iter().map(|s| s.to_string()));
        a.push("--metrics-addr=:8080".to_string());
        json!(a)
    };
    let want = vec![
        (
            args(&["--gpu-backend=nvml"]),
            json!({"nvidia.com/gpu.present": "true"}),
        ),
        (
            args(&["--gpu-backend=sim", "--sim-node=gb200-nvl72-node"]),
            Value::Null,
        ),
    ];
    assert_eq!(rows, want);
}

/// `computeDomains.bindingConditions` turns on both halves (the plugin's channels carry the
/// conditions, the controller sets them) and grants the controller what `binding/binder.rs` calls;
/// off, nothing of it is rendered.
#[test]
fn binding_conditions_reach_both_the_plugin_and_the_controller_with_their_rbac() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let source =
        fs::read_to_string(repo().join("src/compute_domain/controller/binding/binder.rs")).unwrap();
    let calls = [
        ("nodes get", source.contains("get_metadata_opt(node)")),
        ("resourceclaims list watch", {
            let m =
                fs::read_to_string(repo().join("src/compute_domain/controller/mod.rs")).unwrap();
            m.contains("watcher::watcher(claim_api")
        }),
        (
            "resourceclaims/status patch (and resourceclaims/driver)",
            source.contains("/status\", claims.resource_url()"),
        ),
        (
            "computedomainnodes delete",
            source.contains("objects.delete(name"),
        ),
    ];
    let want: Vec<(&str, bool)> = calls.iter().map(|(c, _)| (*c, true)).collect();
    assert_eq!(calls.to_vec(), want);

    let env = |objects: &[Value], kind: &str, name: &str| -> BTreeMap<String, Value> {
        let pod = &named(objects, kind, name)["spec"]["template"]["spec"];
        pod["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"].as_str().unwrap().contains("BINDING"))
            .map(|e| (e["name"].as_str().unwrap().to_string(), e["value"].clone()))
            .collect()
    };
    let controller = "gpu-dra-compute-domain-controller";
    let plugin = "gpu-dra-compute-domain-plugin";
    let off = render_chart(&helm, &ON);
    assert_eq!(env(&off, "Deployment", controller), BTreeMap::new());
    assert_eq!(env(&off, "DaemonSet", plugin), BTreeMap::new());

    let on = render_chart(
        &helm,
        &[
            ON.as_slice(),
            &[
                "--set",
                "computeDomains.bindingConditions=true",
                "--set",
                "computeDomains.bindingTimeout=2m",
            ],
        ]
        .concat(),
    );
    assert_eq!(
        env(&on, "Deployment", controller),
        BTreeMap::from([
            ("GPU_DRA_BINDING_CONDITIONS".to_string(), json!("true")),
            ("GPU_DRA_BINDING_TIMEOUT".to_string(), json!("2m")),
        ])
    );
    assert_eq!(
        env(&on, "DaemonSet", plugin),
        BTreeMap::from([("GPU_DRA_BINDING_CONDITIONS".to_string(), json!("true"))])
    );
    let rules = |kind: &str| named(&on, kind, controller)["rules"].clone();
    let cluster = rules("ClusterRole");
    let added: Vec<Value> = cluster.as_array().unwrap()[6..].to_vec();
    assert_eq!(
        added,
        vec![
            json!({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}),
            json!({"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
                   "verbs": ["list", "watch"]}),
            json!({"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
                   "verbs": ["patch"]}),
            json!({"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
                   "resourceNames": ["compute-domain.nvidia.com"],
                   "verbs": ["arbitrary-node:patch"]}),
        ]
    );
    assert_eq!(
        rules("Role")[0],
        json!({"apiGroups": ["resource.nvidia.com"], "resources": ["computedomainnodes"],
               "verbs": ["list", "watch", "delete", "deletecollection"]})
    );
}

/// The API calls of `src/compute_domain/controller/` and the rule each needs. When this
/// fails, the controller calls something new: grant it in
/// `templates/compute-domain-rbac.yaml` and update this table.
#[test]
fn controller_rbac_grants_exactly_the_calls_in_its_source() {
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let dir = repo().join("src/compute_domain/controller");
    let source: String = ["mod.rs", "reconcile.rs", "cleanup.rs", "leader.rs"]
        .iter()
        .map(|f| fs::read_to_string(dir.join(f)).unwrap())
        .collect();
    let calls = [
        (
            "computedomains list watch",
            source.contains("watcher::watcher(domain_api"),
        ),
        (
            "computedomains patch",
            source.contains("fn set_finalizer") && source.contains("Method::PATCH"),
        ),
        (
            "computedomains get (the finalizers again after a failed test)",
            source.contains("(reading it again)"),
        ),
        (
            "computedomains/status patch",
            source.contains(".patch_status("),
        ),
        (
            "resourceclaimtemplates create get delete",
            source.contains("Api<ResourceClaimTemplate>"),
        ),
        (
            "daemonsets create get delete",
            source.contains("Api<DaemonSet>") && source.contains("DeleteParams::foreground()"),
        ),
        (
            "daemonsets update (an upgrade's new image)",
            source.contains("fn ensure_daemon_set") && source.contains("api.replace(&name"),
        ),
        (
            "computedomainnodes list watch",
            source.contains("watcher::watcher(node_api"),
        ),
        (
            "computedomainnodes deletecollection",
            source.contains(".delete_collection("),
        ),
        ("nodes list", source.contains(".list_metadata(")),
        ("nodes patch", source.contains("Patch::Merge(&unlabel)")),
        ("events create", source.contains("Api::<Event>::namespaced")),
        ("leases get create update", source.contains("Api<Lease>")),
        (
            "pods get (its own, for the daemons' image)",
            source.contains("Api<k8s_openapi::api::core::v1::Pod>"),
        ),
    ];
    let want: Vec<(&str, bool)> = calls.iter().map(|(c, _)| (*c, true)).collect();
    assert_eq!(calls.to_vec(), want);

    let objects = render_chart(&helm, &ON);
    let rules = |kind: &str, name: &str| named(&objects, kind, name)["rules"].clone();
    let controller = "gpu-dra-compute-domain-controller";
    assert_eq!(
        rules("ClusterRole", controller),
        json!([
            {"apiGroups": ["resource.nvidia.com"], "resources": ["computedomains"],
             "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": ["resource.nvidia.com"], "resources": ["computedomains/status"],
             "verbs": ["patch"]},
            {"apiGroups": ["resource.nvidia.com"], "resources": ["computedomains/finalizers"],
             "verbs": ["update"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"],
             "verbs": ["get", "create", "delete"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ])
    );
    assert_eq!(
        rules("Role", controller),
        json!([
            {"apiGroups": ["resource.nvidia.com"], "resources": ["computedomainnodes"],
             "verbs": ["list", "watch", "deletecollection"]},
            {"apiGroups": ["apps"], "resources": ["daemonsets"],
             "verbs": ["get", "create", "update", "delete"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "verbs": ["get", "create", "update"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        ])
    );
    assert_eq!(
        rules("Role", "gpu-dra-imex-daemon"),
        json!([{"apiGroups": ["resource.nvidia.com"], "resources": ["computedomainnodes"],
                "verbs": ["get", "list", "watch", "create", "update"]}])
    );
    // A daemon reads its domain before it creates its object (src/compute_domain/daemon/).
    let daemon = fs::read_to_string(repo().join("src/compute_domain/daemon/round.rs")).unwrap();
    assert!(daemon.contains(".get_opt(&self.config.domain_name)"));
    assert_eq!(
        rules("ClusterRole", "gpu-dra-imex-daemon"),
        json!([{"apiGroups": ["resource.nvidia.com"], "resources": ["computedomains"],
                "verbs": ["get"]}])
    );
    let plugin = rules("ClusterRole", "gpu-dra-compute-domain-plugin");
    assert_eq!(
        plugin[0],
        json!({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]})
    );
    // find_domain lists ComputeDomains in every namespace (src/compute_domain/plugin/).
    assert_eq!(
        plugin[3],
        json!({"apiGroups": ["resource.nvidia.com"], "resources": ["computedomains"],
               "verbs": ["list"]})
    );
    let policy = named(
        &objects,
        "ValidatingAdmissionPolicy",
        "gpu-dra-compute-domain-own-node",
    );
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        json!(
            "request.userInfo.username == \"system:serviceaccount:gpu-dra:gpu-dra-compute-domain-plugin\""
        )
    );
}

#[test]
fn compute_domain_device_classes_are_the_repository_files() {
    let files = [
        "compute-domain-default-channel.nvidia.com.yaml",
        "compute-domain-daemon.nvidia.com.yaml",
    ];
    let want: Vec<(Value, Value)> = files
        .iter()
        .map(|f| {
            let c = yaml_file(&repo().join("device-classes").join(f));
            (
                c["metadata"]["name"].clone(),
                c["spec"]["selectors"][0]["cel"]["expression"].clone(),
            )
        })
        .collect();
    assert_eq!(
        want,
        vec![
            (
                json!(gpu_dra::compute_domain::api::CHANNEL_DEVICE_CLASS),
                json!(
                    "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'channel' && device.attributes['compute-domain.nvidia.com'].id == 0"
                )
            ),
            (
                json!(gpu_dra::compute_domain::api::DAEMON_DEVICE_CLASS),
                json!(
                    "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'daemon'"
                )
            ),
        ]
    );
    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let objects = render_chart(&helm, &ON);
    let got: Vec<(Value, Value)> = of_kind(&objects, "DeviceClass")
        .into_iter()
        .filter(|c| {
            c["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("compute-domain")
        })
        .map(|c| {
            (
                c["metadata"]["name"].clone(),
                c["spec"]["selectors"][0]["cel"]["expression"].clone(),
            )
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn host_managed_imex_is_a_schema_checked_value_passed_to_the_plugin() {
    let defaults = yaml_file(&chart_dir().join("values.yaml"));
    assert_eq!(
        defaults["computeDomains"]["imex"],
        json!({"mode": "DriverManaged", "hostSocketPath": "/etc/nvidia-imex/imex_ctrl.sock"})
    );
    let v = schema();
    let imex = |block: Value| with(json!({"computeDomains": {"imex": block}}));
    let got: Vec<bool> = [
        json!({"mode": "hostManaged"}),
        json!({"mode": "HostManaged", "hostSocketPath": "imex_ctrl.sock"}),
        json!({"mode": "HostManaged", "isolation": "domain"}),
        json!({"mode": "HostManaged", "hostSocketPath": "/run/imex.sock"}),
        json!({"mode": "DriverManaged"}),
    ]
    .into_iter()
    .map(|b| v.is_valid(&imex(b)))
    .collect();
    assert_eq!(got, [false, false, false, true, true]);

    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    // Unprivileged, the container needs SYS_CHROOT for `chroot <driver root> nvidia-imex-ctl`.
    let host = [
        ON.as_slice(),
        &["--set", "computeDomains.imex.mode=HostManaged"],
        &["--set", "kubeletPlugin.privileged=false"],
    ]
    .concat();
    let objects = render_chart(&helm, &host);
    let ds = named(&objects, "DaemonSet", "gpu-dra-compute-domain-plugin");
    let container = &ds["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .filter(|a| a.starts_with("--imex"))
        .collect();
    assert_eq!(
        (args, &container["securityContext"]["capabilities"]["add"]),
        (
            vec![
                "--imex-mode=HostManaged",
                "--imex-host-socket=/etc/nvidia-imex/imex_ctrl.sock"
            ],
            &json!(["SYS_CHROOT"])
        )
    );
}

#[test]
fn binding_conditions_with_host_managed_imex_are_refused_by_the_chart_and_the_plugin() {
    // The plugin binary first: it needs no helm.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args([
            "compute-domain-plugin",
            "--gpu-backend",
            "sim",
            "--binding-conditions",
            "--imex-mode",
            "HostManaged",
            "--metrics-addr",
            "off",
        ])
        .env(
            "GPU_DRA_STATE_DIR",
            std::env::temp_dir().join("gpu-dra-refused"),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--binding-conditions cannot be combined with --imex-mode HostManaged"),
        "{stderr}"
    );

    let Some(helm) = tool("helm", "the rendered-chart checks") else {
        return;
    };
    let chart = chart_dir();
    let out = std::process::Command::new(helm)
        .args([
            "template",
            "gpu-dra",
            chart.to_str().unwrap(),
            "--set",
            "computeDomains.enabled=true",
            "--set",
            "computeDomains.bindingConditions=true",
            "--set",
            "computeDomains.imex.mode=HostManaged",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "helm rendered it");
    assert!(
        stderr.contains("computeDomains.bindingConditions cannot be combined with computeDomains.imex.mode HostManaged"),
        "{stderr}"
    );
}
