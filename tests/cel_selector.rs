//! Selector semantics against a MIG device shaped like ours, including exact error messages.

use gpu_dra::cel::{CelError, DeviceView, Position, Selector};
use k8s_openapi::api::resource::v1::Device;

const MIG_DEVICE: &str = r#"
name: gpu-0-mig-1g10gb-3
attributes:
  type: {string: mig}
  uuid: {string: MIG-4b5c6d7e-8f90-5a1b-9c2d-3e4f5a6b7c8d}
  productName: {string: NVIDIA H100 80GB HBM3}
  profile: {string: 1g.10gb}
  parentUUID: {string: GPU-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d}
  architecture: {string: Hopper}
  cudaComputeCapability: {version: 9.0.0}
  driverVersion: {version: 580.95.5}
  index: {int: 3}
  memorySlices: {ints: [3]}
  resource.kubernetes.io/pciBusID: {string: "0000:18:00.0"}
  resource.kubernetes.io/numaNode: {int: 0}
capacity:
  memory: {value: 9984Mi}
  multiprocessors: {value: "16"}
  copyEngines: {value: "1"}
  decoders: {value: "1"}
  encoders: {value: "0"}
  jpegEngines: {value: "1"}
  ofaEngines: {value: "0"}
"#;

fn mig_device() -> DeviceView {
    let device: Device = serde_yaml::from_str(MIG_DEVICE).expect("fixture is a valid Device");
    DeviceView::from_api("gpu.nvidia.com", &device).expect("fixture is a valid device")
}

fn eval(expression: &str) -> Result<bool, String> {
    Selector::compile(expression)
        .and_then(|s| s.evaluate(&mig_device()))
        .map_err(|e| e.to_string())
}

const GPU: &str = "device.attributes['gpu.nvidia.com']";

fn gpu(rest: &str) -> String {
    format!("{GPU}{rest}")
}

#[test]
fn mig_selector_matches_by_driver_type_profile_and_memory() {
    let want_true = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' \
        && device.attributes['gpu.nvidia.com'].profile == '1g.10gb' \
        && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('9Gi')) >= 0";
    assert_eq!(eval(want_true), Ok(true));
    // 9984Mi is less than 10Gi: the selector of the benchmark does not match this device.
    let too_much = want_true.replace("9Gi", "10Gi");
    assert_eq!(eval(&too_much), Ok(false));
}

#[test]
fn attribute_domains_and_names_follow_kubernetes() {
    let table = [
        // Unqualified names belong to the driver's domain, qualified ones to theirs.
        (gpu(".profile == '1g.10gb'"), true),
        ("device.attributes['resource.kubernetes.io'].pciBusID == '0000:18:00.0'".to_owned(), true),
        ("device.attributes['resource.kubernetes.io'].numaNode == 0".to_owned(), true),
        (format!("'pciBusID' in {GPU}"), false),
        (format!("'profile' in {GPU}"), true),
        // An unknown domain is an empty map.
        ("'x' in device.attributes['other.io']".to_owned(), false),
        ("device.attributes['other.io'].size() == 0".to_owned(), true),
        ("'other.io' in device.attributes".to_owned(), false),
        ("'gpu.nvidia.com' in device.capacity".to_owned(), true),
        ("device.allowMultipleAllocations == false".to_owned(), true),
        (gpu(".exists(name, name == 'parentUUID')"), true),
        ("device.capacity['gpu.nvidia.com'].all(c, device.capacity['gpu.nvidia.com'][c].sign() >= 0)".to_owned(), true),
        (format!("has({GPU}.uuid) && !has({GPU}.serial)"), true),
    ];
    for (expression, want) in table {
        assert_eq!(eval(&expression), Ok(want), "{expression}");
    }
}

#[test]
fn quantity_functions_match_the_kubernetes_library() {
    let table = [
        "device.capacity['gpu.nvidia.com'].memory == quantity('9984Mi')",
        "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('9G'))",
        "device.capacity['gpu.nvidia.com'].multiprocessors.asInteger() == 16",
        "device.capacity['gpu.nvidia.com'].encoders.sign() == 0",
        "quantity('200M') == quantity('0.2G')",
        "quantity('200M').compareTo(quantity('0.2G')) == 0",
        "quantity('50M').compareTo(quantity('50Mi')) == -1",
        "quantity('50Mi').compareTo(quantity('50M')) == 1",
        "quantity('50M').isLessThan(quantity('50Mi'))",
        "!quantity('100M').isLessThan(quantity('50M'))",
        "quantity('50k').add(quantity('20')) == quantity('50.02k')",
        "quantity('50k').sub(20) == quantity('49980')",
        "quantity('50k').add(20).sub(quantity('100k')).sub(-50000) == quantity('20')",
        "quantity('50k').add(20).sub(quantity('100k')).asInteger() == -49980",
        "quantity('50.703k').asApproximateFloat() == 50703.0",
        "quantity('50').isInteger() && !quantity('1.5').isInteger()",
        "sign(quantity('-1')) == -1 && quantity('-1').sign() == -1",
        "isQuantity('1.3Gi') && isQuantity('10000k') && !isQuantity('1,3G') && !isQuantity('200K') && !isQuantity('Mi0')",
    ];
    for expression in table {
        assert_eq!(eval(expression), Ok(true), "{expression}");
    }
}

#[test]
fn semver_functions_match_the_kubernetes_library() {
    let table = [
        gpu(".driverVersion == semver('580.95.5')"),
        gpu(".driverVersion.major() == 580 && ") + &gpu(".driverVersion.minor() == 95"),
        gpu(".cudaComputeCapability.isGreaterThan(semver('8.0.0'))"),
        gpu(".cudaComputeCapability.compareTo(semver('9.0.0')) == 0"),
        "semver('1.2.3').compareTo(semver('2.0.0')) == -1".to_owned(),
        "semver('1.0.0-rc.1').isLessThan(semver('1.0.0'))".to_owned(),
        "semver('1.0.0+build.5') == semver('1.0.0')".to_owned(),
        "semver('v1.0', true) == semver('1.0.0') && semver('01.01.01', true).patch() == 1"
            .to_owned(),
        "isSemver('1.0.0') && !isSemver('v1.0') && isSemver('v1.0', true) && !isSemver('hello')"
            .to_owned(),
    ];
    for expression in table {
        assert_eq!(eval(&expression), Ok(true), "{expression}");
    }
}

#[test]
fn includes_works_on_scalars_and_lists() {
    let table = [
        (gpu(".memorySlices.includes(3)"), true),
        (gpu(".memorySlices.includes(4)"), false),
        (gpu(".profile.includes('1g.10gb')"), true),
        (gpu(".index.includes(3)"), true),
        (gpu(".index.includes('3')"), false),
    ];
    for (expression, want) in table {
        assert_eq!(eval(&expression), Ok(want), "{expression}");
    }
}

#[test]
fn string_extensions_and_bind_are_available() {
    let table = [
        gpu(".productName.lowerAscii().contains('h100')"),
        gpu(".productName.split(' ')[1] == 'H100'"),
        gpu(".productName.matches('^NVIDIA H1[0-9]0')"),
        gpu(".productName.startsWith('NVIDIA') && ") + &gpu(".productName.endsWith('HBM3')"),
        gpu(".productName.indexOf('H100') == 7"),
        gpu(".parentUUID.upperAscii().startsWith('GPU-')"),
        "['a', 'b'].join('-') == 'a-b' && ' x '.trim() == 'x' && 'a.b'.replace('.', '-') == 'a-b'"
            .to_owned(),
        format!("cel.bind(gpu, {GPU}, gpu.type == 'mig' && gpu.profile.startsWith('1g'))"),
        "[1, 2, 3].map(x, x * 2) == [2, 4, 6] && [1, 2, 3].filter(x, x > 1).size() == 2".to_owned(),
        "[1, 2, 3].exists_one(x, x == 2)".to_owned(),
    ];
    for expression in table {
        assert_eq!(eval(&expression), Ok(true), "{expression}");
    }
}

#[test]
fn errors_name_the_expression_the_position_and_the_problem() {
    let valid = "valid suffixes are Ki, Mi, Gi, Ti, Pi, Ei (binary), n, u, m, k, M, G, T, P, E (decimal), \
        none, or e/E followed by an integer exponent such as 1e3";
    let table = [
        (
            gpu(".nosuch == 'x'"),
            format!("evaluating CEL expression \"{GPU}.nosuch == 'x'\" at 1:36: no such key: nosuch"),
        ),
        (
            gpu(".profile"),
            format!("evaluating CEL expression \"{GPU}.profile\": must evaluate to bool, not string"),
        ),
        (
            "1".to_owned(),
            "invalid CEL expression \"1\": must evaluate to bool or the unknown type, not int".to_owned(),
        ),
        (
            "device.driver > 1".to_owned(),
            "evaluating CEL expression \"device.driver > 1\" at 1:15: found no matching overload for '_>_' applied to '(string, int)'".to_owned(),
        ),
        (
            "foo == 1".to_owned(),
            "evaluating CEL expression \"foo == 1\" at 1:1: undeclared reference to 'foo'".to_owned(),
        ),
        (
            "quantity('5G1') == quantity('1')".to_owned(),
            format!("evaluating CEL expression \"quantity('5G1') == quantity('1')\" at 1:9: quantity(): \"5G1\" is not a quantity: unknown suffix \"G1\"; {valid}"),
        ),
        (
            "quantity('1.5').asInteger() == 1".to_owned(),
            "evaluating CEL expression \"quantity('1.5').asInteger() == 1\" at 1:26: asInteger(): cannot convert 1500m to an integer: it has a fractional part".to_owned(),
        ),
        (
            "device.driver ==".to_owned(),
            "invalid CEL expression \"device.driver ==\": ERROR: <input>:1:17: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}\n| device.driver ==\n| ................^".to_owned(),
        ),
    ];
    for (expression, want) in table {
        assert_eq!(eval(&expression), Err(want), "{expression}");
    }
}

#[test]
fn syntax_and_runtime_errors_carry_their_position() {
    let Err(CelError::Syntax { position, .. }) = Selector::compile("device.driver ==") else {
        panic!("a syntax error");
    };
    assert_eq!(
        position,
        Some(Position {
            line: 1,
            column: 17
        })
    );
    let short_circuited =
        Selector::compile("device.driver == 'x' &&\n  device.attributes['gpu.nvidia.com'].nosuch")
            .expect("compiles");
    assert_eq!(
        short_circuited
            .evaluate(&mig_device())
            .map_err(|e| e.to_string()),
        Ok(false)
    );
    let selector =
        Selector::compile("device.driver != 'x' &&\n  device.attributes['gpu.nvidia.com'].nosuch")
            .expect("compiles");
    let Err(CelError::Evaluation {
        position, message, ..
    }) = selector.evaluate(&mig_device())
    else {
        panic!("an evaluation error");
    };
    assert_eq!(
        (position, message.as_str()),
        (
            Some(Position {
                line: 2,
                column: 38
            }),
            "no such key: nosuch"
        )
    );
}

#[test]
fn selectors_views_and_errors_can_be_shared_across_threads() {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<Selector>();
    shareable::<DeviceView>();
    shareable::<CelError>();
    let selector =
        std::sync::Arc::new(Selector::compile(&gpu(".type == 'mig'")).expect("compiles"));
    let device = std::sync::Arc::new(mig_device());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (selector, device) = (selector.clone(), device.clone());
            std::thread::spawn(move || selector.evaluate(&device).map_err(|e| e.to_string()))
        })
        .collect();
    let got: Vec<Result<bool, String>> = handles
        .into_iter()
        .map(|h| h.join().expect("no panic"))
        .collect();
    assert_eq!(got, vec![Ok(true); 4]);
    assert_eq!(selector.expression(), gpu(".type == 'mig'"));
}

/// A VFIO device as `--passthrough` publishes it (NVIDIA's attribute set).
const VFIO_DEVICE: &str = r#"
name: gpu-vfio-3
attributes:
  type: {string: vfio}
  uuid: {string: 6c5a0f7e-2b1d-5c3e-8f4a-9b0c1d2e3f40}
  deviceID: {string: "0x2330"}
  vendorID: {string: "0x10de"}
  productName: {string: NVIDIA H100 80GB HBM3}
  iommuFDEnabled: {bool: false}
  resource.kubernetes.io/pciBusID: {string: "0000:5d:00.0"}
  resource.kubernetes.io/pcieRoot: {string: "pci0000:59"}
  resource.kubernetes.io/numaNode: {int: 0}
capacity:
  addressableMemory: {value: 80Gi}
"#;

fn view(yaml: &str) -> DeviceView {
    let device: Device = serde_yaml::from_str(yaml).expect("fixture is a valid Device");
    DeviceView::from_api("gpu.nvidia.com", &device).expect("fixture is a valid device")
}

/// The one CEL selector of a DeviceClass file of `device-classes/`.
fn class_selector(file: &str) -> Selector {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("device-classes")
        .join(file);
    let class: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let expression = class["spec"]["selectors"][0]["cel"]["expression"]
        .as_str()
        .unwrap();
    Selector::compile(expression).unwrap()
}

#[test]
fn the_vfio_class_selects_vfio_devices_and_neither_full_gpus_nor_mig_devices() {
    let vfio = class_selector("vfio.gpu.nvidia.com.yaml");
    let full_gpu = VFIO_DEVICE
        .replace("gpu-vfio-3", "gpu-3")
        .replace("{string: vfio}", "{string: gpu}");
    let got = [
        vfio.evaluate(&view(VFIO_DEVICE)),
        vfio.evaluate(&view(&full_gpu)),
        vfio.evaluate(&mig_device()),
    ]
    .map(|r| r.map_err(|e| e.to_string()));
    assert_eq!(got, [Ok(true), Ok(false), Ok(false)]);
    // And the GPU and MIG classes leave the VFIO device alone.
    for file in ["gpu.nvidia.com.yaml", "mig.nvidia.com.yaml"] {
        assert_eq!(
            class_selector(file)
                .evaluate(&view(VFIO_DEVICE))
                .map_err(|e| e.to_string()),
            Ok(false),
            "{file}"
        );
    }
}

/// docs/vm-passthrough.md's KubeVirt example: its ResourceClaimTemplate is a valid
/// resource.k8s.io/v1 object naming the VFIO class, and its model selector matches an H100's
/// VFIO device.
#[test]
fn the_kubevirt_example_claim_template_names_the_vfio_class_and_its_selector_matches() {
    use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/vm-passthrough.md"),
    )
    .unwrap();
    let block = doc
        .split("```yaml\n")
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains("kind: ResourceClaimTemplate"))
        .expect("a ResourceClaimTemplate example");
    let first = block.split("\n---\n").next().unwrap();
    let template: ResourceClaimTemplate = serde_yaml::from_str(first).unwrap();
    let devices = template.spec.unwrap().spec.unwrap().devices.unwrap();
    let request = &devices.requests.as_ref().unwrap()[0];
    let exactly = request.exactly.as_ref().unwrap();
    assert_eq!(
        (request.name.as_str(), exactly.device_class_name.as_str()),
        ("gpu", "vfio.gpu.nvidia.com")
    );
    let expression = &exactly.selectors.as_ref().unwrap()[0]
        .cel
        .as_ref()
        .unwrap()
        .expression;
    let selector = Selector::compile(expression).unwrap();
    assert_eq!(
        selector
            .evaluate(&view(VFIO_DEVICE))
            .map_err(|e| e.to_string()),
        Ok(true)
    );
    let config = &devices.config.as_ref().unwrap()[0];
    let opaque = config.opaque.as_ref().unwrap();
    assert_eq!(
        (opaque.driver.as_str(), &opaque.parameters.0),
        (
            "gpu.nvidia.com",
            &serde_json::json!({
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "VfioDeviceConfig",
                "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": true}
            })
        )
    );
}
