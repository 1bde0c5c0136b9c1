//! Strict decoding of one opaque parameters object into a [`Config`].

use serde_json::{Map, Value};

use crate::quantity::{NANOS_PER_UNIT, Quantity, QuantityError};

use super::{
    API_VERSIONS, ApiVersion, Config, ConfigKind, IommuBackend, MIN_PINNED_MEMORY_BYTES, MpsConfig,
    OpaqueError, SharingConfig, TimeSliceInterval, VfioSettings, VgpuSettings,
};

const TOP_FIELDS: &str = "apiVersion, kind, sharing";
const SHARING_FIELDS: &str = "strategy, timeSlicingConfig, mpsConfig";
const TIME_SLICING_FIELDS: &str = "interval";
const MPS_FIELDS: &str = "defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit, defaultPerDevicePinnedMemoryLimit, multiUser";
const KINDS: &str = "GpuConfig, MigDeviceConfig, VfioDeviceConfig, VgpuDeviceConfig";
const VFIO_TOP_FIELDS: &str = "apiVersion, kind, iommu";
const VGPU_TOP_FIELDS: &str = "apiVersion, kind, profile, typeID, params";
/// The longest `params` accepted: NVIDIA's `vgpu_params` takes a short list of settings.
pub(super) const MAX_VGPU_PARAMS: usize = 1024;
const IOMMU_FIELDS: &str = "backendPolicy, enableAPIDevice";
const BACKEND_POLICIES: &str = "LegacyOnly, PreferIommuFD";
const STRATEGIES: &str = "TimeSlicing, MPS";
const INTERVALS: &str = "Default, Short, Medium, Long";

/// Decodes one opaque parameters object, as the API server stores it.
///
/// Guarantees on success: the `apiVersion` and `kind` are supported, no unknown field exists
/// at any level, strategy and blocks agree, the thread percentage is within 0–100 and every
/// memory limit is a quantity of at least 1Mi, and `multiUser` is a boolean (whether the GPU
/// supports it is checked where the hardware is known). A `MigDeviceConfig` never carries an interval
/// other than `Default`. Fields set to `null` count as absent.
///
/// # Errors
/// The first problem found, as an [`OpaqueError`] naming the field path (`sharing.mpsConfig.…`),
/// the value and the valid choices or range. `apiVersion` and `kind` are checked before the
/// other fields, so an object of another API is reported as such.
pub fn decode(parameters: &Value) -> Result<Config, OpaqueError> {
    let top = object(
        parameters,
        "parameters",
        "an object with apiVersion, kind and sharing",
    )?;
    let api_version = api_version(top)?;
    let kind = kind(top)?;
    if kind == ConfigKind::VfioDeviceConfig {
        reject_unknown(top, "", VFIO_TOP_FIELDS)?;
        return Ok(Config {
            api_version,
            kind,
            sharing: None,
            vfio: Some(match present(top, "iommu") {
                None => VfioSettings::default(),
                Some(value) => iommu(value)?,
            }),
            vgpu: None,
        });
    }
    if kind == ConfigKind::VgpuDeviceConfig {
        reject_unknown(top, "", VGPU_TOP_FIELDS)?;
        return Ok(Config {
            api_version,
            kind,
            sharing: None,
            vfio: None,
            vgpu: Some(vgpu(top)?),
        });
    }
    reject_unknown(top, "", TOP_FIELDS)?;
    let sharing = match present(top, "sharing") {
        None => None,
        Some(value) => Some(sharing(value, kind)?),
    };
    Ok(Config {
        api_version,
        kind,
        sharing,
        vfio: None,
        vgpu: None,
    })
}

/// The fields of a `VgpuDeviceConfig`.
fn vgpu(top: &Map<String, Value>) -> Result<VgpuSettings, OpaqueError> {
    let profile = match present(top, "profile") {
        None => None,
        Some(v) => {
            let text = string(v, "profile")?.trim();
            if text.is_empty() {
                return Err(wrong_type(
                    "profile",
                    "a vGPU type name such as \"H100-4C\"",
                    v,
                ));
            }
            Some(text.to_string())
        }
    };
    let type_id = match present(top, "typeID") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .filter(|id| *id > 0)
                .ok_or_else(|| OpaqueError::OutOfRange {
                    path: "typeID".to_owned(),
                    value: v.to_string(),
                    range: "1–4294967295 (a vGPU type ID, as nvidia-smi vgpu -s -v lists it)",
                })?,
        ),
    };
    let params = match present(top, "params") {
        None => None,
        Some(v) => Some(vgpu_params(string(v, "params")?)?),
    };
    Ok(VgpuSettings {
        profile,
        type_id,
        params,
    })
}

/// `params`: `key=value` pairs separated by commas, as `vgpu_params` takes them; spaces
/// around each pair are dropped. Keys are lower-case letters, digits and `_`; values are
/// printable ASCII without `,`, `=` or spaces.
fn vgpu_params(text: &str) -> Result<String, OpaqueError> {
    let bad = |why: String| OpaqueError::InvalidChoice {
        path: "params".to_owned(),
        value: text.to_owned(),
        valid: format!(
            "key=value pairs separated by commas, such as \"frame_rate_limiter=0,disable_vnc=1\" ({why})"
        ),
    };
    if text.len() > MAX_VGPU_PARAMS {
        return Err(bad(format!("at most {MAX_VGPU_PARAMS} characters")));
    }
    let mut pairs = Vec::new();
    for pair in text.split(',') {
        let pair = pair.trim();
        let Some((key, value)) = pair.split_once('=') else {
            return Err(bad(format!("{pair:?} has no '='")));
        };
        let key_ok = !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !key_ok {
            return Err(bad(format!(
                "key {key:?} is not lower-case letters, digits and '_'"
            )));
        }
        let value_ok = !value.is_empty()
            && value
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b',' && b != b'=');
        if !value_ok {
            return Err(bad(format!("the value of {key} is empty or not printable")));
        }
        pairs.push(format!("{key}={value}"));
    }
    Ok(pairs.join(","))
}

/// `iommu` of a `VfioDeviceConfig`.
fn iommu(value: &Value) -> Result<VfioSettings, OpaqueError> {
    let block = object(
        value,
        "iommu",
        "an object with backendPolicy and enableAPIDevice",
    )?;
    reject_unknown(block, "iommu", IOMMU_FIELDS)?;
    let backend = match present(block, "backendPolicy") {
        None => IommuBackend::LegacyOnly,
        Some(v) => match string(v, "iommu.backendPolicy")? {
            "LegacyOnly" => IommuBackend::LegacyOnly,
            "PreferIommuFD" => IommuBackend::PreferIommuFd,
            other => {
                return Err(invalid_choice(
                    "iommu.backendPolicy",
                    other,
                    BACKEND_POLICIES,
                ));
            }
        },
    };
    let api_device = match present(block, "enableAPIDevice") {
        None => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| wrong_type("iommu.enableAPIDevice", "a boolean", v))?,
    };
    Ok(VfioSettings {
        backend,
        api_device,
    })
}

fn api_version(top: &Map<String, Value>) -> Result<ApiVersion, OpaqueError> {
    let valid = API_VERSIONS.join(", ");
    let Some(value) = present(top, "apiVersion") else {
        return Err(OpaqueError::Missing {
            path: "apiVersion".to_owned(),
            valid,
        });
    };
    match string(value, "apiVersion")? {
        "resource.nvidia.com/v1beta1" => Ok(ApiVersion::ResourceNvidiaV1beta1),
        "gpu.nvidia.com/v1alpha1" => Ok(ApiVersion::GpuNvidiaV1alpha1),
        other => Err(OpaqueError::UnsupportedApiVersion {
            value: other.to_owned(),
            valid,
        }),
    }
}

fn kind(top: &Map<String, Value>) -> Result<ConfigKind, OpaqueError> {
    let Some(value) = present(top, "kind") else {
        return Err(OpaqueError::Missing {
            path: "kind".to_owned(),
            valid: KINDS.to_owned(),
        });
    };
    match string(value, "kind")? {
        "GpuConfig" => Ok(ConfigKind::GpuConfig),
        "MigDeviceConfig" => Ok(ConfigKind::MigDeviceConfig),
        "VfioDeviceConfig" => Ok(ConfigKind::VfioDeviceConfig),
        "VgpuDeviceConfig" => Ok(ConfigKind::VgpuDeviceConfig),
        other => Err(invalid_choice("kind", other, KINDS)),
    }
}

fn sharing(value: &Value, kind: ConfigKind) -> Result<SharingConfig, OpaqueError> {
    let block = object(value, "sharing", "an object with strategy and its config")?;
    reject_unknown(block, "sharing", SHARING_FIELDS)?;
    let Some(strategy) = present(block, "strategy") else {
        return Err(OpaqueError::Missing {
            path: "sharing.strategy".to_owned(),
            valid: STRATEGIES.to_owned(),
        });
    };
    let time_slicing = present(block, "timeSlicingConfig");
    let mps = present(block, "mpsConfig");
    match string(strategy, "sharing.strategy")? {
        // The seed talk spells it with a hyphen.
        "TimeSlicing" | "Time-Slicing" => {
            if mps.is_some() {
                return Err(OpaqueError::StrategyMismatch {
                    field: "mpsConfig",
                    strategy: "TimeSlicing",
                    expected: "timeSlicingConfig",
                });
            }
            let interval = match time_slicing {
                None => TimeSliceInterval::Default,
                Some(value) => interval(value)?,
            };
            if kind == ConfigKind::MigDeviceConfig && interval != TimeSliceInterval::Default {
                return Err(OpaqueError::IntervalOnMig {
                    interval,
                    device: None,
                });
            }
            Ok(SharingConfig::TimeSlicing { interval })
        }
        "MPS" => {
            if time_slicing.is_some() {
                return Err(OpaqueError::StrategyMismatch {
                    field: "timeSlicingConfig",
                    strategy: "MPS",
                    expected: "mpsConfig",
                });
            }
            match mps {
                None => Ok(SharingConfig::Mps(MpsConfig::default())),
                Some(value) => Ok(SharingConfig::Mps(mps_config(value)?)),
            }
        }
        other => Err(invalid_choice("sharing.strategy", other, STRATEGIES)),
    }
}

fn interval(value: &Value) -> Result<TimeSliceInterval, OpaqueError> {
    let path = "sharing.timeSlicingConfig";
    let block = object(value, path, "an object with interval")?;
    reject_unknown(block, path, TIME_SLICING_FIELDS)?;
    let Some(name) = present(block, "interval") else {
        return Ok(TimeSliceInterval::Default);
    };
    let path = "sharing.timeSlicingConfig.interval";
    let name = string(name, path)?;
    TimeSliceInterval::ALL
        .into_iter()
        .find(|i| i.name() == name)
        .ok_or_else(|| invalid_choice(path, name, INTERVALS))
}

fn mps_config(value: &Value) -> Result<MpsConfig, OpaqueError> {
    let path = "sharing.mpsConfig";
    let block = object(value, path, "an object with MPS limits")?;
    reject_unknown(block, path, MPS_FIELDS)?;
    let active_thread_percentage = present(block, "defaultActiveThreadPercentage")
        .map(percentage)
        .transpose()?;
    let pinned_memory_bytes = present(block, "defaultPinnedDeviceMemoryLimit")
        .map(|v| memory(v, "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"))
        .transpose()?;
    let mut per_device_pinned_memory_bytes = Vec::new();
    if let Some(value) = present(block, "defaultPerDevicePinnedMemoryLimit") {
        let path = "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit";
        let map = object(value, path, "an object of device key to quantity")?;
        for (key, limit) in map {
            if limit.is_null() {
                continue;
            }
            let bytes = memory(limit, &format!("{path}.{key}"))?;
            per_device_pinned_memory_bytes.push((key.clone(), bytes));
        }
        per_device_pinned_memory_bytes.sort();
    }
    let multi_user = match present(block, "multiUser") {
        None => false,
        Some(Value::Bool(on)) => *on,
        Some(other) => {
            return Err(wrong_type(
                "sharing.mpsConfig.multiUser",
                "true or false",
                other,
            ));
        }
    };
    Ok(MpsConfig {
        active_thread_percentage,
        pinned_memory_bytes,
        per_device_pinned_memory_bytes,
        multi_user,
    })
}

fn percentage(value: &Value) -> Result<u8, OpaqueError> {
    let path = "sharing.mpsConfig.defaultActiveThreadPercentage";
    let out_of_range = || OpaqueError::OutOfRange {
        path: path.to_owned(),
        value: value.to_string(),
        range: "0–100",
    };
    let Value::Number(number) = value else {
        return Err(wrong_type(path, "an integer from 0 to 100", value));
    };
    if let Some(whole) = number.as_u64() {
        return u8::try_from(whole)
            .ok()
            .filter(|p| *p <= 100)
            .ok_or_else(out_of_range);
    }
    if number.as_i64().is_some() {
        return Err(out_of_range());
    }
    // A float: accept only whole values such as 50.0, which YAML tools sometimes produce.
    let float = number.as_f64().unwrap_or(f64::NAN);
    if float.fract() != 0.0 || !float.is_finite() {
        return Err(wrong_type(path, "an integer from 0 to 100", value));
    }
    if !(0.0..=100.0).contains(&float) {
        return Err(out_of_range());
    }
    u8::try_from(float as i64).map_err(|_| out_of_range())
}

/// A memory limit in bytes: a quantity string or a plain number, rounded up to whole bytes
/// as Kubernetes' `Value()` does, at least 1Mi.
fn memory(value: &Value, path: &str) -> Result<u64, OpaqueError> {
    let text = match value {
        Value::String(text) => text.clone(),
        Value::Number(number) => number.to_string(),
        other => return Err(wrong_type(path, "a quantity such as \"10Gi\"", other)),
    };
    let quantity: Quantity =
        text.parse()
            .map_err(|err: QuantityError| OpaqueError::NotAQuantity {
                path: path.to_owned(),
                value: text.clone(),
                problem: err.problem(),
            })?;
    let unit = i128::from(NANOS_PER_UNIT);
    let nanos = quantity.as_nanos();
    let whole = nanos / unit + i128::from(nanos % unit > 0);
    u64::try_from(whole)
        .ok()
        .filter(|bytes| *bytes >= MIN_PINNED_MEMORY_BYTES)
        .ok_or(OpaqueError::MemoryLimitOutOfRange {
            path: path.to_owned(),
            value: text,
        })
}

fn object<'a>(
    value: &'a Value,
    path: &str,
    expected: &'static str,
) -> Result<&'a Map<String, Value>, OpaqueError> {
    value
        .as_object()
        .ok_or_else(|| wrong_type(path, expected, value))
}

fn string<'a>(value: &'a Value, path: &str) -> Result<&'a str, OpaqueError> {
    value
        .as_str()
        .ok_or_else(|| wrong_type(path, "a string", value))
}

/// The field's value, with `null` treated as absent.
fn present<'a>(block: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    block.get(field).filter(|v| !v.is_null())
}

fn reject_unknown(
    block: &Map<String, Value>,
    path: &str,
    valid: &'static str,
) -> Result<(), OpaqueError> {
    let known = |name: &str| valid.split(", ").any(|v| v == name);
    match block.keys().find(|name| !known(name)) {
        None => Ok(()),
        Some(name) => Err(OpaqueError::UnknownField {
            path: join(path, name),
            valid,
        }),
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

fn invalid_choice(path: &str, value: &str, valid: &str) -> OpaqueError {
    OpaqueError::InvalidChoice {
        path: path.to_owned(),
        value: value.to_owned(),
        valid: valid.to_owned(),
    }
}

fn wrong_type(path: &str, expected: &'static str, value: &Value) -> OpaqueError {
    OpaqueError::WrongType {
        path: path.to_owned(),
        expected,
        got: value.to_string(),
    }
}
