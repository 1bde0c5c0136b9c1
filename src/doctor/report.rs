//! One check's verdict, the report of all of them, and how they are printed.

use serde::Serialize;

/// How a check came out. Ordered: `Ok < Warn < Fail`, so the worst is the maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Nothing to do.
    Ok,
    /// Works, but something is off or could not be checked.
    Warn,
    /// GPU claims on this node will not work until this is fixed.
    Fail,
}

impl Status {
    /// `ok`, `warn` or `fail`, as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One line of the report: the check's stable name, its status, what was found, and for a
/// warning or failure the fix in one sentence with a link to its section of
/// `docs/troubleshooting.md`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable name (`nvml`, `gpu-0`, `cdi-root`, …): scripts match on it.
    pub name: String,
    /// The verdict.
    pub status: Status,
    /// What was found, for people.
    pub found: String,
    /// For warn and fail: what to do, ending in a docs link; `None` when ok.
    pub fix: Option<String>,
}

/// Where the fixes link to: the troubleshooting guide, by section anchor.
pub const DOCS: &str = "docs/troubleshooting.md";

/// Every section of [`DOCS`] a fix links to: one per check (`gpu-index` for the `gpu-<index>`
/// checks). A test keeps them in step with the guide's headings.
pub const ANCHORS: [&str; 30] = [
    "nvml",
    "gpus",
    "gpu-index",
    "driver-root",
    "device-nodes",
    "cdi-root",
    "container-runtime",
    "plugin-dir",
    "registry-dir",
    "tools",
    "iommu",
    "vfio-modules",
    "vfio-device",
    "gpu-vfio-index",
    "vgpu-manager",
    "vgpu-vfs",
    "vgpu-mdev",
    "vgpu-types",
    "plugin-socket",
    "nvidia-smi",
    "fabric-manager",
    "cluster",
    "resource-api",
    "feature-gates",
    "resource-slices",
    "scheduling-cost",
    "device-classes",
    "admission-policy",
    "rbac",
    "vgpu-compatibility-groups",
];

impl Check {
    /// A passing check.
    pub fn ok(name: impl Into<String>, found: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status: Status::Ok,
            found: found.into(),
            fix: None,
        }
    }

    /// A warning: `fix` is one sentence, `anchor` the section of the troubleshooting guide.
    pub fn warn(
        name: impl Into<String>,
        found: impl Into<String>,
        fix: &str,
        anchor: &str,
    ) -> Check {
        Check::bad(Status::Warn, name, found, fix, anchor)
    }

    /// A failure: `fix` is one sentence, `anchor` the section of the troubleshooting guide.
    pub fn fail(
        name: impl Into<String>,
        found: impl Into<String>,
        fix: &str,
        anchor: &str,
    ) -> Check {
        Check::bad(Status::Fail, name, found, fix, anchor)
    }

    fn bad(
        status: Status,
        name: impl Into<String>,
        found: impl Into<String>,
        fix: &str,
        anchor: &str,
    ) -> Check {
        debug_assert!(
            ANCHORS.contains(&anchor),
            "fix anchor {anchor:?} is not in ANCHORS"
        );
        Check {
            name: name.into(),
            status,
            found: found.into(),
            fix: Some(format!("{fix} ({DOCS}#{anchor})")),
        }
    }
}

/// Every check of one run, in the order they ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Report {
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    /// The worst status of all checks (`Ok` for none).
    pub fn worst(&self) -> Status {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Ok)
    }

    /// The exit code contract: 0 when every check is ok, 1 on a warning, 2 on a failure.
    pub fn exit_code(&self) -> u8 {
        match self.worst() {
            Status::Ok => 0,
            Status::Warn => 1,
            Status::Fail => 2,
        }
    }

    /// `{"checks": [{"name", "status", "found", "fix"}]}`, pretty-printed with a newline.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".into());
        text.push('\n');
        text
    }

    /// The table for people: one line per check (status, name, found), the fix indented
    /// under warnings and failures, and a count at the end.
    pub fn render_table(&self) -> String {
        let width = self
            .checks
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(5)
            .max(5);
        let mut out = format!("{:<6} {:<width$}  FOUND\n", "STATUS", "CHECK");
        for c in &self.checks {
            out.push_str(&format!(
                "{:<6} {:<width$}  {}\n",
                c.status.as_str(),
                c.name,
                c.found
            ));
            if let Some(fix) = &c.fix {
                out.push_str(&format!("{:<6} {:<width$}  fix: {fix}\n", "", ""));
            }
        }
        let count = |s: Status| self.checks.iter().filter(|c| c.status == s).count();
        out.push_str(&format!(
            "\n{} ok, {} warn, {} fail\n",
            count(Status::Ok),
            count(Status::Warn),
            count(Status::Fail)
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(statuses: &[Status]) -> Report {
        Report {
            checks: statuses
                .iter()
                .enumerate()
                .map(|(i, s)| Check {
                    name: format!("c{i}"),
                    status: *s,
                    found: String::new(),
                    fix: None,
                })
                .collect(),
        }
    }

    #[test]
    fn exit_code_is_zero_when_all_ok_one_on_a_warning_two_on_a_failure() {
        let codes: Vec<u8> = [
            vec![],
            vec![Status::Ok, Status::Ok],
            vec![Status::Ok, Status::Warn],
            vec![Status::Warn, Status::Fail, Status::Ok],
        ]
        .iter()
        .map(|s| report(s).exit_code())
        .collect();
        assert_eq!(codes, vec![0, 0, 1, 2]);
    }

    #[test]
    fn json_has_the_four_fields_of_every_check() {
        let r = Report {
            checks: vec![
                Check::ok("nvml", "driver 580"),
                Check::fail("cdi-root", "read-only", "Make it writable.", "cdi-root"),
            ],
        };
        let got: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        let want = serde_json::json!({"checks": [
            {"name": "nvml", "status": "ok", "found": "driver 580", "fix": null},
            {"name": "cdi-root", "status": "fail", "found": "read-only",
             "fix": "Make it writable. (docs/troubleshooting.md#cdi-root)"},
        ]});
        assert_eq!(got, want);
    }

    /// GitHub's heading anchors: lower case, punctuation other than `-` dropped, spaces to `-`.
    fn anchor(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect()
    }

    #[test]
    fn every_fix_anchor_is_a_section_of_the_troubleshooting_guide_which_starts_with_doctor() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(DOCS);
        let guide = std::fs::read_to_string(path).unwrap();
        let headings: Vec<&str> = guide
            .lines()
            .filter_map(|l| l.strip_prefix('#'))
            .map(|l| l.trim_start_matches('#'))
            .collect();
        let anchors: Vec<String> = headings.iter().map(|h| anchor(h)).collect();
        let missing: Vec<&str> = ANCHORS
            .iter()
            .copied()
            .filter(|a| !anchors.iter().any(|h| h == a))
            .collect();
        assert_eq!(missing, Vec::<&str>::new(), "sections: {anchors:?}");
        assert!(
            headings[1].contains("gpu-dra doctor"),
            "first section: {}",
            headings[1]
        );
    }

    #[test]
    fn table_puts_the_fix_under_its_check_and_counts_statuses() {
        let r = Report {
            checks: vec![
                Check::ok("nvml", "driver 580"),
                Check::warn("gpu-0", "MIG pending", "Reset the GPU.", "gpu-index"),
            ],
        };
        let want = "STATUS CHECK  FOUND\n\
                    ok     nvml   driver 580\n\
                    warn   gpu-0  MIG pending\n\
                    \x20      \x20      fix: Reset the GPU. (docs/troubleshooting.md#gpu-index)\n\
                    \n1 ok, 1 warn, 0 fail\n";
        assert_eq!(r.render_table(), want);
    }
}
