//! Names of claim specs, their devices and their files, and the CDI name grammar.
//!
//! Layout (the same as NVIDIA's Go driver, so a node can switch drivers): one spec per claim
//! of kind `k8s.<driver name>/claim`; device `<claim-uid>-<DRA device>[-<share id>]`; ID
//! `<kind>=<device>`; file `<vendor>-claim_<claim-uid>.json` (the CDI convention for
//! generated, transient specs).

/// Driver name of NVIDIA's DRA driver, whose claim specs we are compatible with.
pub const DEFAULT_DRIVER_NAME: &str = "gpu.nvidia.com";

/// The CDI class of per-claim specs.
pub const CLAIM_CLASS: &str = "claim";

/// A name that breaks the CDI grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// A vendor or class part of a CDI kind is invalid.
    #[error(
        "invalid CDI {field} {value:?}: {problem}; use ASCII letters, digits, '_', '-' and '.', \
         starting with a letter and ending with a letter or digit"
    )]
    VendorOrClass {
        field: &'static str,
        value: String,
        problem: &'static str,
    },
    /// A CDI device name (or a part used to build one) is invalid.
    #[error(
        "invalid CDI {field} {value:?}: {problem}; use ASCII letters, digits, '_', '-', '.' \
         and ':', starting and ending with a letter or digit"
    )]
    DeviceName {
        field: &'static str,
        value: String,
        problem: &'static str,
    },
}

/// Checks a CDI vendor or class name (`field` names it in the error).
///
/// # Errors
/// [`NameError::VendorOrClass`] saying what is wrong.
pub fn validate_vendor_or_class(field: &'static str, value: &str) -> Result<(), NameError> {
    let fail = |problem| NameError::VendorOrClass {
        field,
        value: value.to_string(),
        problem,
    };
    let first = value.chars().next().ok_or_else(|| fail("it is empty"))?;
    if !first.is_ascii_alphabetic() {
        return Err(fail("it must start with a letter"));
    }
    if !value.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(fail("it must end with a letter or digit"));
    }
    if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(fail("it contains a character outside the allowed set"));
    }
    Ok(())
}

/// Checks a CDI device name (`field` names it in the error).
///
/// # Errors
/// [`NameError::DeviceName`] saying what is wrong.
pub fn validate_device_name(field: &'static str, value: &str) -> Result<(), NameError> {
    let fail = |problem| NameError::DeviceName {
        field,
        value: value.to_string(),
        problem,
    };
    if value.is_empty() {
        return Err(fail("it is empty"));
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if !value.starts_with(alnum) || !value.ends_with(alnum) {
        return Err(fail("it must start and end with a letter or digit"));
    }
    if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
    {
        return Err(fail("it contains a character outside the allowed set"));
    }
    Ok(())
}

/// How this driver names its per-claim CDI specs, devices and files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimNaming {
    vendor: String,
}

impl Default for ClaimNaming {
    fn default() -> Self {
        ClaimNaming {
            vendor: format!("k8s.{DEFAULT_DRIVER_NAME}"),
        }
    }
}

impl ClaimNaming {
    /// Naming for a driver registered as `driver_name` (vendor `k8s.<driver_name>`).
    ///
    /// # Errors
    /// [`NameError::VendorOrClass`] when the resulting vendor is not a valid CDI vendor.
    pub fn for_driver(driver_name: &str) -> Result<Self, NameError> {
        let vendor = format!("k8s.{driver_name}");
        validate_vendor_or_class("vendor (k8s.<driver name>)", &vendor)?;
        Ok(ClaimNaming { vendor })
    }

    /// The CDI vendor, e.g. `k8s.gpu.nvidia.com`.
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// The spec kind, e.g. `k8s.gpu.nvidia.com/claim`.
    pub fn kind(&self) -> String {
        format!("{}/{CLAIM_CLASS}", self.vendor)
    }

    /// The spec's device name for one allocated device of a claim:
    /// `<claim-uid>-<device>` or `<claim-uid>-<device>-<share id>`.
    ///
    /// # Errors
    /// [`NameError::DeviceName`] naming the part that breaks the CDI device-name grammar.
    pub fn device_name(
        &self,
        claim_uid: &str,
        device: &str,
        share_id: Option<&str>,
    ) -> Result<String, NameError> {
        validate_device_name("claim UID", claim_uid)?;
        validate_device_name("DRA device name", device)?;
        let mut name = format!("{claim_uid}-{device}");
        if let Some(share_id) = share_id {
            validate_device_name("share ID", share_id)?;
            name.push('-');
            name.push_str(share_id);
        }
        Ok(name)
    }

    /// The fully-qualified CDI device ID handed to the kubelet: `<kind>=<device name>`.
    ///
    /// # Errors
    /// As [`ClaimNaming::device_name`].
    pub fn device_id(
        &self,
        claim_uid: &str,
        device: &str,
        share_id: Option<&str>,
    ) -> Result<String, NameError> {
        let name = self.device_name(claim_uid, device, share_id)?;
        Ok(format!("{}={name}", self.kind()))
    }

    /// The spec file name for a claim, e.g. `k8s.gpu.nvidia.com-claim_<uid>.json`.
    ///
    /// # Errors
    /// [`NameError::DeviceName`] when the UID could not be part of a device name (which also
    /// rules out `/` and so any path escape).
    pub fn spec_file_name(&self, claim_uid: &str) -> Result<String, NameError> {
        validate_device_name("claim UID", claim_uid)?;
        Ok(format!("{}{claim_uid}.json", self.file_prefix()))
    }

    /// The claim UID of a spec file this naming produces (`.json`, or the `.yaml` NVIDIA's
    /// Go driver writes), or `None` for any other file.
    pub fn claim_uid_of_file(&self, file_name: &str) -> Option<String> {
        let rest = file_name.strip_prefix(&self.file_prefix())?;
        let uid = rest
            .strip_suffix(".json")
            .or_else(|| rest.strip_suffix(".yaml"))?;
        validate_device_name("claim UID", uid).ok()?;
        Some(uid.to_string())
    }

    fn file_prefix(&self) -> String {
        format!("{}-{CLAIM_CLASS}_", self.vendor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "3f2a9c1e-8b7d-4e21-a0c4-5d6e7f809a1b";

    #[test]
    fn default_naming_matches_nvidias_driver() {
        let n = ClaimNaming::default();
        let got = (
            n.kind(),
            n.device_id(UID, "gpu-0-mig-1g10gb-19-0", None).unwrap(),
            n.spec_file_name(UID).unwrap(),
        );
        let want = (
            "k8s.gpu.nvidia.com/claim".to_string(),
            format!("k8s.gpu.nvidia.com/claim={UID}-gpu-0-mig-1g10gb-19-0"),
            format!("k8s.gpu.nvidia.com-claim_{UID}.json"),
        );
        assert_eq!(got, want);
    }

    #[test]
    fn share_id_is_appended_to_the_device_name() {
        let got = ClaimNaming::default()
            .device_name(UID, "gpu-1", Some("7c1d"))
            .unwrap();
        assert_eq!(got, format!("{UID}-gpu-1-7c1d"));
    }

    #[test]
    fn custom_driver_name_changes_the_vendor() {
        let n = ClaimNaming::for_driver("gpu.example.com").unwrap();
        assert_eq!(n.kind(), "k8s.gpu.example.com/claim");
    }

    #[test]
    fn invalid_driver_name_is_rejected_with_the_value() {
        let err = ClaimNaming::for_driver("gpu/bad").unwrap_err();
        assert!(err.to_string().contains("k8s.gpu/bad"), "got {err}");
    }

    #[test]
    fn names_outside_the_grammar_are_rejected_naming_the_field() {
        let n = ClaimNaming::default();
        let cases = [
            (n.device_name("", "gpu-0", None), "claim UID"),
            (n.device_name(UID, "gpu/0", None), "DRA device name"),
            (n.device_name(UID, "gpu-0", Some("-x")), "share ID"),
            (n.device_name(UID, "gpu=0", None), "DRA device name"),
            (n.spec_file_name("../etc"), "claim UID"),
        ];
        for (got, field) in cases {
            let err = got.unwrap_err();
            assert!(err.to_string().contains(field), "{field}: got {err}");
        }
    }

    #[test]
    fn vendor_and_class_grammar() {
        let cases = [
            ("a", true),
            ("k8s.gpu.nvidia.com", true),
            ("1abc", false),
            ("abc-", false),
            ("a b", false),
            ("", false),
        ];
        for (value, want) in cases {
            assert_eq!(
                validate_vendor_or_class("vendor", value).is_ok(),
                want,
                "{value}"
            );
        }
    }

    #[test]
    fn claim_uid_is_recovered_from_our_file_names_only() {
        let n = ClaimNaming::default();
        let cases = [
            (format!("k8s.gpu.nvidia.com-claim_{UID}.json"), Some(UID)),
            (format!("k8s.gpu.nvidia.com-claim_{UID}.yaml"), Some(UID)),
            (
                format!(".k8s.gpu.nvidia.com-claim_{UID}.json.tmp-1-0"),
                None,
            ),
            (format!("k8s.gpu.nvidia.com-device_{UID}.json"), None),
            ("other.json".to_string(), None),
        ];
        for (file, want) in cases {
            assert_eq!(n.claim_uid_of_file(&file).as_deref(), want, "{file}");
        }
    }
}
