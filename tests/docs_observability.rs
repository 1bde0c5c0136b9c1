//! docs/observability.md lists every metric the plugin exports, with its labels, and gives an
//! example query for each: adding a metric without documenting it fails here.

use std::collections::BTreeSet;

mod telemetry_support;

fn doc() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/observability.md"
    ))
    .expect("docs/observability.md")
}

/// Every family the plugin's registry exports, with the label names its samples carry once
/// every kind of reading is present.
fn exported() -> Vec<(String, BTreeSet<String>)> {
    let metrics = gpu_dra::metrics::Metrics::new();
    metrics.record_error("fetch");
    metrics.set_claim_device_seconds(vec![(
        vec![
            ("namespace", "a".into()),
            ("class", "b".into()),
            ("profile", "c".into()),
            ("sharing", "d".into()),
        ],
        1.0,
    )]);
    metrics.set_device_telemetry(&[telemetry_support::every_reading()]);
    metrics
        .families()
        .into_iter()
        .map(|f| {
            let labels = f
                .samples
                .iter()
                .flat_map(|s| s.labels.iter().map(|(k, _)| k.to_string()))
                .filter(|l| l != "le")
                .collect();
            (f.name.to_string(), labels)
        })
        .collect()
}

#[test]
fn every_exported_metric_is_documented_with_its_labels() {
    let doc = doc();
    let mut missing = Vec::new();
    for (name, labels) in exported() {
        let Some(row) = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
        else {
            missing.push(format!("{name}: no table row"));
            continue;
        };
        let device = name.starts_with("gpu_dra_device_");
        for label in labels {
            // The device families share one label table; their rows name the extra ones.
            let shared = [
                "gpu",
                "uuid",
                "device",
                "profile",
                "namespace",
                "claim",
                "pod",
            ];
            if device && shared.contains(&label.as_str()) {
                let first_cell = |l: &str| l.split('|').nth(1).map(str::to_string);
                let named = format!("`{label}`");
                if !doc
                    .lines()
                    .filter_map(first_cell)
                    .any(|cell| cell.contains(&named))
                {
                    missing.push(format!("{name}: label {label} not in the label table"));
                }
                continue;
            }
            if !row.contains(&format!("`{label}`")) {
                missing.push(format!("{name}: label {label} not in its row"));
            }
        }
    }
    assert_eq!(missing, Vec::<String>::new());
}

#[test]
fn every_exported_metric_has_an_example_query() {
    let doc = doc();
    let lines: Vec<&str> = doc.lines().collect();
    let missing: Vec<String> = exported()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| {
            // A comment naming the metric, and the query under it using it.
            let comment = format!("# {name}:");
            !lines.windows(2).any(|w| {
                w[0].starts_with(&comment) && w[1].contains(name.as_str()) && !w[1].starts_with('#')
            })
        })
        .collect();
    assert_eq!(missing, Vec::<String>::new());
}
