//! Usage accounting: device-seconds held by claims (`gpu_dra_claim_device_seconds_total`).
//! The plugin computes the series; this module only holds the last set for scrapes.

use std::sync::Mutex;

use super::text::{Family, Kind, Sample};

/// The last series the plugin set, replaced as a whole under a short lock.
#[derive(Default)]
pub(super) struct ClaimDeviceSeconds(Mutex<Vec<Sample>>);

impl ClaimDeviceSeconds {
    /// Replaces every series with `series` (labels, device-seconds), in the order given.
    pub(super) fn set(&self, series: Vec<(Vec<(&'static str, String)>, f64)>) {
        let samples = series
            .into_iter()
            .map(|(labels, value)| Sample::new(labels, value))
            .collect();
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = samples;
    }

    /// `gpu_dra_claim_device_seconds_total` with the last series set.
    pub(super) fn family(&self) -> Family {
        Family {
            name: "gpu_dra_claim_device_seconds_total",
            help: "Device-seconds held by claims prepared on this node, from prepare to unprepare; a consumable-capacity share counts its part of the device. Kept across plugin restarts.",
            kind: Kind::Counter,
            samples: self.0.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::text;

    fn labels(ns: &str) -> Vec<(&'static str, String)> {
        vec![
            ("namespace", ns.to_string()),
            ("class", "mig.nvidia.com".to_string()),
            ("profile", "1g.10gb".to_string()),
            ("sharing", "exclusive".to_string()),
        ]
    }

    #[test]
    fn device_seconds_render_one_series_per_label_set() {
        let usage = ClaimDeviceSeconds::default();
        usage.set(vec![(labels("a"), 90.5), (labels("b"), 3600.0)]);
        let text = text::render(&[usage.family()]);
        let got: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("gpu_dra_claim_device_seconds_total{"))
            .collect();
        assert_eq!(
            got,
            vec![
                r#"gpu_dra_claim_device_seconds_total{namespace="a",class="mig.nvidia.com",profile="1g.10gb",sharing="exclusive"} 90.5"#,
                r#"gpu_dra_claim_device_seconds_total{namespace="b",class="mig.nvidia.com",profile="1g.10gb",sharing="exclusive"} 3600"#,
            ]
        );
    }

    #[test]
    fn setting_the_series_replaces_the_previous_set() {
        let usage = ClaimDeviceSeconds::default();
        usage.set(vec![(labels("a"), 1.0), (labels("b"), 2.0)]);
        usage.set(vec![(labels("b"), 5.0)]);
        assert_eq!(vec![Sample::new(labels("b"), 5.0)], usage.family().samples);
    }
}
