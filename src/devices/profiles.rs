//! `--mig-profiles`: which MIG profiles a dynamic-MIG GPU publishes.
//!
//! The scheduler's allocator pays for every published device of every node it evaluates, for
//! every pod (docs/architecture.md, "Scheduling cost"), so an admin who only hands out a few
//! profiles can publish only those. The choice removes whole profiles, never single
//! placements of a profile: every placement of an offered profile stays published, so every
//! packing of the offered profiles the hardware accepts stays allocatable, and the counters
//! (unchanged) keep every allocation carvable.
//!
//! A list applies per GPU: each dynamic-MIG GPU publishes the listed profiles its model has
//! (profile names differ per model: an A100-40GB has `1g.5gb`, an H100 `1g.10gb`). A name that
//! no MIG-capable GPU of the node knows is refused ([`check`]); a GPU that has none of the
//! listed profiles publishes no MIG device, with a warning in the model. Static MIG devices
//! (they exist) are published whatever the list says.

use std::fmt;
use std::str::FromStr;

use crate::hardware::NodeInventory;

/// The flag name, for messages.
const FLAG: &str = "--mig-profiles";

/// Which MIG profiles dynamic-MIG GPUs publish: shared out among the node's GPUs (`split`,
/// the plugin's default), all of them, or a named few.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MigProfileSet {
    /// Every profile of the GPU's model, at every placement (the library's default, and
    /// `--mig-profiles all`).
    #[default]
    All,
    /// The node's dynamic-MIG GPUs of one model share the profiles out: every GPU its full GPU
    /// and whole-GPU profile, each GPU one family of the others at every placement
    /// ([`super::split`]); every profile stays claimable on the node.
    Split,
    /// Only these profiles (as NVIDIA names them, e.g. `1g.10gb`, `1g.10gb+me`), in the order
    /// given, without duplicates; never empty.
    Only(Vec<String>),
}

impl MigProfileSet {
    /// Whether a GPU publishes the placements of the profile named `profile`.
    /// With [`MigProfileSet::Split`] the answer is per placement ([`super::split::plan`]):
    /// this says whether some GPU may publish it, which is every profile.
    pub fn offers(&self, profile: &str) -> bool {
        match self {
            MigProfileSet::All | MigProfileSet::Split => true,
            MigProfileSet::Only(names) => names.iter().any(|n| n == profile),
        }
    }
}

impl fmt::Display for MigProfileSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigProfileSet::All => f.write_str("all"),
            MigProfileSet::Split => f.write_str("split"),
            MigProfileSet::Only(names) => f.write_str(&names.join(",")),
        }
    }
}

/// A `--mig-profiles` value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigProfilesError {
    /// The value is not a comma-separated list of names.
    #[error(
        "{FLAG} {value:?}: {problem}; give profile names separated by commas (e.g. 1g.10gb,3g.40gb,7g.80gb), \"split\" or \"all\""
    )]
    Syntax {
        /// The flag's value.
        value: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A listed profile exists on no MIG-capable GPU of the node.
    #[error(
        "{FLAG}: {profile:?} is not a MIG profile of any GPU on this node; valid: {valid}; or \"split\" or \"all\" alone"
    )]
    Unknown {
        /// The unknown name.
        profile: String,
        /// The profiles of each GPU model of the node, e.g.
        /// `NVIDIA H100 80GB HBM3 (GPU 0-7): 1g.10gb, 1g.10gb+me, …`.
        valid: String,
    },
}

impl FromStr for MigProfileSet {
    type Err = MigProfilesError;

    /// `split` and `""` (an empty `GPU_DRA_MIG_PROFILES`, as the chart's empty value reads)
    /// mean the plugin's default, shared out; `all` every profile; otherwise names separated
    /// by commas (spaces around a name are ignored; a name given twice counts once). Fails on
    /// an empty name.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let trimmed = value.trim();
        if trimmed.is_empty() || trimmed.eq_ignore_ascii_case("split") {
            return Ok(MigProfileSet::Split);
        }
        if trimmed.eq_ignore_ascii_case("all") {
            return Ok(MigProfileSet::All);
        }
        let mut names: Vec<String> = Vec::new();
        for (i, name) in trimmed.split(',').map(str::trim).enumerate() {
            if name.is_empty() {
                return Err(MigProfilesError::Syntax {
                    value: value.to_string(),
                    problem: format!("name {} is empty", i + 1),
                });
            }
            if name.eq_ignore_ascii_case("all") || name.eq_ignore_ascii_case("split") {
                return Err(MigProfilesError::Syntax {
                    value: value.to_string(),
                    problem: format!("{name:?} cannot be combined with profile names"),
                });
            }
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
        Ok(MigProfileSet::Only(names))
    }
}

/// Checks that every listed profile is a profile of at least one MIG-capable GPU of
/// `inventory` (whatever its policy, so a typo is caught before a GPU turns dynamic). A node
/// without MIG-capable GPUs accepts any list: there is nothing to check it against and nothing
/// it changes.
pub fn check(set: &MigProfileSet, inventory: &NodeInventory) -> Result<(), MigProfilesError> {
    let MigProfileSet::Only(names) = set else {
        return Ok(());
    };
    let capable: Vec<_> = inventory.gpus.iter().filter(|g| g.mig.capable).collect();
    if capable.is_empty() {
        return Ok(());
    }
    for name in names {
        if capable.iter().any(|g| g.profile_by_name(name).is_some()) {
            continue;
        }
        // One line per model, in GPU order: the GPUs that have it and its profiles.
        let mut models: Vec<(&str, Vec<u32>, String)> = Vec::new();
        for gpu in &capable {
            match models.iter_mut().find(|(m, _, _)| *m == gpu.product_name) {
                Some((_, indices, _)) => indices.push(gpu.index),
                None => models.push((
                    &gpu.product_name,
                    vec![gpu.index],
                    gpu.mig_profiles
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                )),
            }
        }
        let valid = models
            .iter()
            .map(|(model, indices, profiles)| {
                let gpus = indices
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",");
                format!("{model} (GPU {gpus}): {profiles}")
            })
            .collect::<Vec<_>>()
            .join("; ");
        return Err(MigProfilesError::Unknown {
            profile: name.clone(),
            valid,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only(names: &[&str]) -> MigProfileSet {
        MigProfileSet::Only(names.iter().map(|n| n.to_string()).collect())
    }

    #[test]
    fn flag_values_parse_to_split_all_or_a_deduplicated_list() {
        let cases = [
            ("", MigProfileSet::Split),
            (" ", MigProfileSet::Split),
            ("split", MigProfileSet::Split),
            ("all", MigProfileSet::All),
            (" ALL ", MigProfileSet::All),
            ("1g.10gb", only(&["1g.10gb"])),
            (
                "1g.10gb, 3g.40gb,7g.80gb,1g.10gb",
                only(&["1g.10gb", "3g.40gb", "7g.80gb"]),
            ),
            ("1g.10gb+me", only(&["1g.10gb+me"])),
        ];
        for (value, want) in cases {
            assert_eq!(Ok(want), value.parse::<MigProfileSet>(), "{value:?}");
        }
    }

    #[test]
    fn empty_names_and_all_inside_a_list_are_refused_naming_the_flag_and_value() {
        for value in [
            "1g.10gb,",
            ",1g.10gb",
            "1g.10gb,,7g.80gb",
            "all,1g.10gb",
            "1g.10gb,split",
        ] {
            let err = value.parse::<MigProfileSet>().unwrap_err();
            let text = err.to_string();
            assert!(text.contains("--mig-profiles"), "{text}");
            assert!(text.contains(&format!("{value:?}")), "{text}");
        }
    }

    #[test]
    fn a_list_prints_back_as_it_parses() {
        for value in ["all", "split", "1g.10gb,3g.40gb,7g.80gb"] {
            let set: MigProfileSet = value.parse().unwrap();
            assert_eq!(value, set.to_string());
        }
    }

    #[test]
    fn only_listed_profiles_are_offered() {
        let set = only(&["1g.10gb", "7g.80gb"]);
        assert!(set.offers("1g.10gb"));
        assert!(set.offers("7g.80gb"));
        assert!(!set.offers("1g.10gb+me"));
        assert!(!set.offers("3g.40gb"));
        assert!(MigProfileSet::All.offers("3g.40gb"));
    }
}
