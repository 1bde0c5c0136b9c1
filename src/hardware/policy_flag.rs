//! `--gpu-mig-policies`: MIG policies of single GPUs, `INDEX=POLICY` pairs separated by commas
//! (`1=dynamic,3=static`). The NVML backend cannot read a node file, so this is how a node
//! mixes policies (the simulated node files give them per GPU group).

use std::collections::BTreeMap;

use super::MigPolicy;

/// A malformed `--gpu-mig-policies` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--gpu-mig-policies: {entry:?} {problem}; expected INDEX=POLICY pairs separated by commas, POLICY one of disabled, static, dynamic (e.g. 1=dynamic,3=static)"
)]
pub struct PolicyFlagError {
    /// The entry at fault.
    pub entry: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// Parses `--gpu-mig-policies`; an empty value means no per-GPU policy.
pub fn parse_gpu_policies(text: &str) -> Result<BTreeMap<u32, MigPolicy>, PolicyFlagError> {
    let mut out = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let err = |problem| PolicyFlagError {
            entry: entry.to_string(),
            problem,
        };
        let (index, policy) = entry.split_once('=').ok_or_else(|| err("has no '='"))?;
        let index: u32 = index
            .trim()
            .parse()
            .map_err(|_| err("does not start with a GPU index"))?;
        let policy = match policy.trim() {
            "disabled" => MigPolicy::Disabled,
            "static" => MigPolicy::Static,
            "dynamic" => MigPolicy::Dynamic,
            _ => return Err(err("names no policy")),
        };
        if out.insert(index, policy).is_some() {
            return Err(err("repeats a GPU index"));
        }
    }
    Ok(out)
}

/// The flag value that gives `policies` (one per GPU index), as `parse_gpu_policies` reads it.
pub fn format_gpu_policies(policies: &[MigPolicy]) -> String {
    policies
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{i}={}", p.as_str()))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_gpu_policies_parse_and_format_round_trip() {
        let want = [MigPolicy::Static, MigPolicy::Dynamic, MigPolicy::Disabled];
        let text = format_gpu_policies(&want);
        assert_eq!(text, "0=static,1=dynamic,2=disabled");
        let got = parse_gpu_policies(&text).unwrap();
        assert_eq!(got.values().copied().collect::<Vec<_>>(), want);
        assert!(parse_gpu_policies("").unwrap().is_empty());
    }

    #[test]
    fn bad_entries_are_named_with_the_valid_choices() {
        for (text, problem) in [
            ("1:dynamic", "has no '='"),
            ("x=static", "does not start with a GPU index"),
            ("1=carved", "names no policy"),
            ("1=static,1=dynamic", "repeats a GPU index"),
        ] {
            let e = parse_gpu_policies(text).unwrap_err();
            assert_eq!(e.problem, problem, "{text}");
            assert!(e.to_string().contains("disabled, static, dynamic"));
        }
    }
}
