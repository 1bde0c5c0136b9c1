//! The health policy: what each kind of fault means (ignored, degraded, failed), the taint a
//! degraded or failed device carries, and how long a degraded GPU is held down.
//!
//! The file (`--health-policy FILE`, YAML or JSON) overrides the built-in defaults field by
//! field; every field is optional:
//!
//! ```yaml
//! taintKey: gpu.nvidia.com/unhealthy   # a qualified label name
//! effects:
//!   degraded: NoSchedule               # None | NoSchedule | NoExecute
//!   failed: NoExecute
//! holdDown: 5m                         # 90s, 5m, 1h or whole seconds; 0 = re-check at once
//! xid:
//!   failed: [48, 63, 64, 74, 79, 92, 94, 95, 119, 120]   # moved to failed
//!   degraded: [31]                                       # moved to degraded
//!   ignored: [13, 43, 45, 68, 109]                       # moved to ignored
//!   other: degraded                    # XIDs no list names: ignored | degraded | failed
//!   replaceDefaults: false             # true: start from empty lists instead of the defaults
//! ecc:
//!   doubleBit: failed
//!   singleBit: ignored
//! gpuLost: failed
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::hardware::health::FaultKind;

/// The default taint key.
pub const DEFAULT_TAINT_KEY: &str = "gpu.nvidia.com/unhealthy";
/// XIDs NVIDIA lists as needing a GPU reset or node action (ECC page retirement and row
/// remapping failures, fallen off the bus, NVLink and GSP errors, …): failed by default.
pub const DEFAULT_FAILED_XIDS: [u64; 10] = [48, 63, 64, 74, 79, 92, 94, 95, 119, 120];
/// XIDs an application causes (illegal address, MMU fault, reset channel, …): ignored by
/// default, as NVIDIA's device plugin does.
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];
/// Default hold-down of a degraded GPU, seconds.
pub const DEFAULT_HOLD_DOWN_SECONDS: u64 = 300;

/// What a fault makes of a device, from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum HealthState {
    /// Working; the fault, if any, is ignored.
    #[default]
    Healthy,
    /// Usable by what runs there, but new claims should go elsewhere (`NoSchedule`); clears
    /// itself after the hold-down without new faults.
    Degraded,
    /// Broken until a recovery (a GPU reset) or a restart that finds it healthy (`NoExecute`).
    Failed,
}

impl HealthState {
    /// `healthy`, `degraded` or `failed`: log fields and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Degraded => "degraded",
            HealthState::Failed => "failed",
        }
    }
}

/// A `resource.k8s.io/v1` device taint effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaintEffect {
    /// Informational: the scheduler ignores it (Kubernetes 1.35+).
    None,
    /// New claims that do not tolerate it are not allocated the device.
    NoSchedule,
    /// As `NoSchedule`, and pods whose claims hold the device are evicted.
    NoExecute,
}

impl TaintEffect {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::None => "None",
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// The effective health policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Key of the taint an unhealthy device carries; its value names the cause (`xid-79`).
    pub taint_key: String,
    /// Effect of a degraded device's taint.
    pub degraded_effect: TaintEffect,
    /// Effect of a failed device's taint (also of a prepared device whose GPU is gone).
    pub failed_effect: TaintEffect,
    /// Seconds without a new degrading fault after which a degraded GPU is healthy again.
    pub hold_down_seconds: u64,
    /// State per XID named explicitly.
    pub xids: BTreeMap<u64, HealthState>,
    /// State of XIDs not in `xids`.
    pub other_xids: HealthState,
    /// State after an uncorrectable ECC error.
    pub ecc_double_bit: HealthState,
    /// State after a corrected ECC error.
    pub ecc_single_bit: HealthState,
    /// State of a GPU that fell off the bus.
    pub gpu_lost: HealthState,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        let mut xids = BTreeMap::new();
        for x in DEFAULT_FAILED_XIDS {
            xids.insert(x, HealthState::Failed);
        }
        for x in DEFAULT_IGNORED_XIDS {
            xids.insert(x, HealthState::Healthy);
        }
        HealthPolicy {
            taint_key: DEFAULT_TAINT_KEY.to_string(),
            degraded_effect: TaintEffect::NoSchedule,
            failed_effect: TaintEffect::NoExecute,
            hold_down_seconds: DEFAULT_HOLD_DOWN_SECONDS,
            xids,
            other_xids: HealthState::Degraded,
            ecc_double_bit: HealthState::Failed,
            ecc_single_bit: HealthState::Healthy,
            gpu_lost: HealthState::Failed,
        }
    }
}

impl HealthPolicy {
    /// The state a fault of `kind` puts its GPU (or MIG instance) in.
    pub fn state_of(&self, kind: FaultKind) -> HealthState {
        match kind {
            FaultKind::Xid { code } => self.xids.get(&code).copied().unwrap_or(self.other_xids),
            FaultKind::EccSingleBit => self.ecc_single_bit,
            FaultKind::EccDoubleBit => self.ecc_double_bit,
            FaultKind::GpuLost => self.gpu_lost,
        }
    }

    /// The taint effect of `state` (`None` for healthy: no taint).
    pub fn effect_of(&self, state: HealthState) -> Option<TaintEffect> {
        match state {
            HealthState::Healthy => None,
            HealthState::Degraded => Some(self.degraded_effect),
            HealthState::Failed => Some(self.failed_effect),
        }
    }

    /// Reads a policy file (YAML or JSON) over the defaults. Fails naming the file, the
    /// field, the value and the valid choices.
    pub fn load(path: &Path) -> Result<HealthPolicy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            file: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            PolicyError::Invalid { field, detail, .. } => PolicyError::Invalid {
                file: path.display().to_string(),
                field,
                detail,
            },
            other => other,
        })
    }

    /// Parses a policy document (YAML or JSON; empty means all defaults) over the defaults.
    pub fn parse(text: &str) -> Result<HealthPolicy, PolicyError> {
        let invalid = |field: &str, detail: String| PolicyError::Invalid {
            file: "<policy>".into(),
            field: field.into(),
            detail,
        };
        let file: PolicyFile = if text.trim().is_empty() {
            PolicyFile::default()
        } else {
            serde_yaml::from_str(text).map_err(|e| {
                let field = e
                    .location()
                    .map_or_else(String::new, |l| format!("line {}", l.line()));
                invalid(&field, e.to_string())
            })?
        };
        let mut policy = HealthPolicy::default();
        if let Some(key) = file.taint_key {
            check_taint_key(&key).map_err(|d| invalid("taintKey", d))?;
            policy.taint_key = key;
        }
        if let Some(effects) = file.effects {
            if let Some(e) = effects.degraded {
                policy.degraded_effect =
                    parse_effect(&e).map_err(|d| invalid("effects.degraded", d))?;
            }
            if let Some(e) = effects.failed {
                policy.failed_effect =
                    parse_effect(&e).map_err(|d| invalid("effects.failed", d))?;
            }
        }
        if let Some(h) = file.hold_down {
            policy.hold_down_seconds = parse_duration(&h).map_err(|d| invalid("holdDown", d))?;
        }
        if let Some(x) = file.xid {
            if x.replace_defaults.unwrap_or(false) {
                policy.xids.clear();
            }
            let mut named: BTreeMap<u64, &str> = BTreeMap::new();
            for (list, state, codes) in [
                ("xid.failed", HealthState::Failed, &x.failed),
                ("xid.degraded", HealthState::Degraded, &x.degraded),
                ("xid.ignored", HealthState::Healthy, &x.ignored),
            ] {
                for &code in codes.iter().flatten() {
                    if let Some(other) = named.insert(code, list) {
                        return Err(invalid(
                            list,
                            format!("XID {code} is also in {other}; name each XID in one list"),
                        ));
                    }
                    policy.xids.insert(code, state);
                }
            }
            if let Some(o) = x.other {
                policy.other_xids = parse_state(&o).map_err(|d| invalid("xid.other", d))?;
            }
        }
        if let Some(ecc) = file.ecc {
            if let Some(s) = ecc.double_bit {
                policy.ecc_double_bit = parse_state(&s).map_err(|d| invalid("ecc.doubleBit", d))?;
            }
            if let Some(s) = ecc.single_bit {
                policy.ecc_single_bit = parse_state(&s).map_err(|d| invalid("ecc.singleBit", d))?;
            }
        }
        if let Some(s) = file.gpu_lost {
            policy.gpu_lost = parse_state(&s).map_err(|d| invalid("gpuLost", d))?;
        }
        Ok(policy)
    }
}

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("reading health policy {file}")]
    Read {
        /// The file.
        file: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A field has a value the policy cannot use.
    #[error("health policy {file}: {field}: {detail}")]
    Invalid {
        /// The file.
        file: String,
        /// The field (`effects.failed`), or the line of a syntax error.
        field: String,
        /// The value and the valid choices.
        detail: String,
    },
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PolicyFile {
    taint_key: Option<String>,
    effects: Option<EffectsFile>,
    hold_down: Option<serde_yaml::Value>,
    xid: Option<XidFile>,
    ecc: Option<EccFile>,
    gpu_lost: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EffectsFile {
    degraded: Option<String>,
    failed: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct XidFile {
    failed: Option<Vec<u64>>,
    degraded: Option<Vec<u64>>,
    ignored: Option<Vec<u64>>,
    other: Option<String>,
    replace_defaults: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EccFile {
    double_bit: Option<String>,
    single_bit: Option<String>,
}

fn parse_effect(s: &str) -> Result<TaintEffect, String> {
    match s {
        "None" => Ok(TaintEffect::None),
        "NoSchedule" => Ok(TaintEffect::NoSchedule),
        "NoExecute" => Ok(TaintEffect::NoExecute),
        other => Err(format!(
            "{other:?} is not a device taint effect; valid: None, NoSchedule, NoExecute"
        )),
    }
}

fn parse_state(s: &str) -> Result<HealthState, String> {
    match s {
        "ignored" | "healthy" => Ok(HealthState::Healthy),
        "degraded" => Ok(HealthState::Degraded),
        "failed" => Ok(HealthState::Failed),
        other => Err(format!(
            "{other:?} is not a health state; valid: ignored, degraded, failed"
        )),
    }
}

/// `90`, `90s`, `5m`, `1h` → seconds.
fn parse_duration(v: &serde_yaml::Value) -> Result<u64, String> {
    let bad = |shown: String| {
        format!(
            "{shown} is not a duration; valid: whole seconds or a number with s, m or h (e.g. 90s, 5m, 1h)"
        )
    };
    if let Some(n) = v.as_u64() {
        return Ok(n);
    }
    let Some(s) = v.as_str() else {
        return Err(bad(format!("{v:?}")));
    };
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits.parse().map_err(|_| bad(format!("{s:?}")))?;
    let factor = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(bad(format!("{s:?}"))),
    };
    n.checked_mul(factor).ok_or_else(|| bad(format!("{s:?}")))
}

/// A qualified label name: an optional DNS-subdomain prefix and `/`, then a name of at most
/// 63 characters of alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn check_taint_key(key: &str) -> Result<(), String> {
    let bad = |why: &str| format!("{key:?} is not a label name ({why}); e.g. {DEFAULT_TAINT_KEY}");
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if p.is_empty() || p.len() > 253 || !p.split('.').all(label_ok) {
            return Err(bad("the prefix must be a DNS subdomain"));
        }
    }
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty()
        || name.len() > 63
        || !name.chars().all(ok_char)
        || !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err(bad("the name must be 1-63 alphanumerics, '-', '_' or '.'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fail_critical_xids_and_ignore_application_ones() {
        let p = HealthPolicy::parse("").unwrap();
        assert_eq!(p, HealthPolicy::default());
        for x in DEFAULT_FAILED_XIDS {
            assert_eq!(p.state_of(FaultKind::Xid { code: x }), HealthState::Failed);
        }
        for x in [13, 31, 43] {
            assert_eq!(p.state_of(FaultKind::Xid { code: x }), HealthState::Healthy);
        }
        assert_eq!(
            p.state_of(FaultKind::Xid { code: 62 }),
            HealthState::Degraded
        );
        assert_eq!(p.state_of(FaultKind::EccDoubleBit), HealthState::Failed);
        assert_eq!(p.state_of(FaultKind::EccSingleBit), HealthState::Healthy);
        assert_eq!(p.state_of(FaultKind::GpuLost), HealthState::Failed);
        assert_eq!(
            p.effect_of(HealthState::Failed),
            Some(TaintEffect::NoExecute)
        );
        assert_eq!(
            p.effect_of(HealthState::Degraded),
            Some(TaintEffect::NoSchedule)
        );
    }

    #[test]
    fn a_file_overrides_field_by_field() {
        let p = HealthPolicy::parse(
            "effects: {failed: NoSchedule}\nholdDown: 2m\nxid: {degraded: [31], other: ignored}\necc: {singleBit: degraded}\n",
        )
        .unwrap();
        assert_eq!(p.failed_effect, TaintEffect::NoSchedule);
        assert_eq!(p.degraded_effect, TaintEffect::NoSchedule);
        assert_eq!(p.hold_down_seconds, 120);
        assert_eq!(
            p.state_of(FaultKind::Xid { code: 31 }),
            HealthState::Degraded
        );
        assert_eq!(p.state_of(FaultKind::Xid { code: 79 }), HealthState::Failed);
        assert_eq!(
            p.state_of(FaultKind::Xid { code: 62 }),
            HealthState::Healthy
        );
        assert_eq!(p.state_of(FaultKind::EccSingleBit), HealthState::Degraded);
        let json = HealthPolicy::parse(
            r#"{"holdDown": 30, "xid": {"replaceDefaults": true, "failed": [79]}}"#,
        )
        .unwrap();
        assert_eq!(json.hold_down_seconds, 30);
        assert_eq!(
            json.state_of(FaultKind::Xid { code: 48 }),
            HealthState::Degraded
        );
        assert_eq!(
            json.state_of(FaultKind::Xid { code: 13 }),
            HealthState::Degraded
        );
    }

    #[test]
    fn bad_values_name_the_field_the_value_and_the_choices() {
        let cases = [
            (
                "effects: {failed: PreferNoSchedule}",
                "effects.failed",
                "None, NoSchedule, NoExecute",
            ),
            ("gpuLost: broken", "gpuLost", "ignored, degraded, failed"),
            ("holdDown: 5 minutes", "holdDown", "90s, 5m, 1h"),
            ("taintKey: Bad Key", "taintKey", "label name"),
            (
                "xid: {failed: [31], ignored: [31]}",
                "xid.ignored",
                "also in xid.failed",
            ),
            ("taintkey: x", "line 1", "unknown field `taintkey`"),
        ];
        for (text, field, detail) in cases {
            let e = HealthPolicy::parse(text).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains(detail), "{text}: {e}");
        }
    }
}
