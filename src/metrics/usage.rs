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
