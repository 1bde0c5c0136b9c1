//! The container runtime's CDI support, read from its configuration files.
//!
//! containerd 2.x (config `version = 3`) has CDI on by default, in
//! `[plugins."io.containerd.cri.v1.runtime"]`; containerd 1.7 (`version = 2`) needs
//! `enable_cdi = true` in `[plugins."io.containerd.grpc.v1.cri"]`. CRI-O has CDI on since 1.23.
//! Both read specs from `cdi_spec_dirs` (default `/etc/cdi` and `/var/run/cdi`), which must
//! hold the plugin's `--cdi-root`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::report::Check;

/// Where the runtimes' configuration files are (flags, so tests and unusual hosts can point
/// elsewhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimePaths {
    /// containerd's config file (default `/etc/containerd/config.toml`).
    pub containerd: PathBuf,
    /// CRI-O's config file (default `/etc/crio/crio.conf`); `<file>.d/*.conf` drop-ins are
    /// read after it.
    pub crio: PathBuf,
}

impl Default for RuntimePaths {
    fn default() -> RuntimePaths {
        RuntimePaths {
            containerd: "/etc/containerd/config.toml".into(),
            crio: "/etc/crio/crio.conf".into(),
        }
    }
}

/// The configuration text found for each runtime: `(path, text)` pairs, empty when absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeConfigs {
    /// containerd's config, if the file exists.
    pub containerd: Option<(PathBuf, String)>,
    /// CRI-O's config file and drop-ins, in the order CRI-O applies them.
    pub crio: Vec<(PathBuf, String)>,
}

/// Reads the files at `paths`; files that are missing or unreadable are left out (the check
/// then says the runtime is unknown).
pub fn read_configs(paths: &RuntimePaths) -> RuntimeConfigs {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .ok()
            .map(|t| (p.to_path_buf(), t))
    };
    let mut crio: Vec<(PathBuf, String)> = read(&paths.crio).into_iter().collect();
    let dropins = PathBuf::from(format!("{}.d", paths.crio.display()));
    if let Ok(entries) = std::fs::read_dir(&dropins) {
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "conf"))
            .collect();
        files.sort();
        crio.extend(files.iter().filter_map(|p| read(p)));
    }
    RuntimeConfigs {
        containerd: read(&paths.containerd),
        crio,
    }
}

const CHECK: &str = "container-runtime";
const CRI_V2: &str = "plugins.io.containerd.grpc.v1.cri";
const CRI_V3: &str = "plugins.io.containerd.cri.v1.runtime";

/// The verdict on the runtimes' CDI support for specs written to `cdi_root`.
pub fn check(configs: &RuntimeConfigs, cdi_root: &Path) -> Check {
    let mut verdicts = Vec::new();
    if let Some((path, text)) = &configs.containerd {
        verdicts.push(containerd(path, text, cdi_root));
    }
    if !configs.crio.is_empty() {
        verdicts.push(crio(&configs.crio, cdi_root));
    }
    if verdicts.is_empty() {
        return Check::warn(
            CHECK,
            "unknown: no containerd or CRI-O configuration found (in a pod, the host's /etc is \
             not mounted)",
            "Run `gpu-dra doctor` on the node, or pass --containerd-config / --crio-config, to \
             check that the runtime has CDI enabled",
            "container-runtime",
        );
    }
    // The worst verdict, with every runtime's finding.
    let found = verdicts
        .iter()
        .map(|c| c.found.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let mut worst = verdicts
        .into_iter()
        .max_by_key(|c| c.status)
        .expect("at least one verdict");
    worst.found = found;
    worst
}

fn containerd(path: &Path, text: &str, cdi_root: &Path) -> Check {
    let toml = Toml::parse(text);
    let version = toml
        .get("", "version")
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1);
    let (section, default_on) = if version >= 3 {
        (CRI_V3, true)
    } else {
        (CRI_V2, false)
    };
    let file = path.display();
    let enable = toml.get(section, "enable_cdi");
    let dirs = toml.get(section, "cdi_spec_dirs").map(parse_string_array);
    match enable {
        Some("false") => {
            return Check::fail(
                CHECK,
                format!("containerd ({file}, config version {version}): enable_cdi = false"),
                &format!(
                    "Set enable_cdi = true under [{}] and restart containerd",
                    quoted(section)
                ),
                "container-runtime",
            );
        }
        None if !default_on => {
            return Check::warn(
                CHECK,
                format!(
                    "containerd ({file}, config version {version}): enable_cdi not set; \
                     containerd 1.7 then runs without CDI (2.x has it on)"
                ),
                &format!(
                    "Set enable_cdi = true under [{}] and restart containerd",
                    quoted(section)
                ),
                "container-runtime",
            );
        }
        _ => {}
    }
    if let Some(dirs) = dirs
        && !dirs.iter().any(|d| same_dir(Path::new(d), cdi_root))
    {
        return Check::fail(
            CHECK,
            format!(
                "containerd ({file}): cdi_spec_dirs = {dirs:?} does not include the CDI root {}",
                cdi_root.display()
            ),
            "Add the plugin's --cdi-root to cdi_spec_dirs, or set --cdi-root to one of them",
            "container-runtime",
        );
    }
    Check::ok(
        CHECK,
        format!("containerd ({file}, config version {version}): CDI enabled"),
    )
}

fn crio(files: &[(PathBuf, String)], cdi_root: &Path) -> Check {
    // Later drop-ins override earlier settings.
    let dirs = files
        .iter()
        .filter_map(|(_, text)| {
            Toml::parse(text)
                .get("crio.runtime", "cdi_spec_dirs")
                .map(parse_string_array)
        })
        .next_back();
    let file = files[0].0.display();
    if let Some(dirs) = dirs
        && !dirs.iter().any(|d| same_dir(Path::new(d), cdi_root))
    {
        return Check::fail(
            CHECK,
            format!(
                "CRI-O ({file}): cdi_spec_dirs = {dirs:?} does not include the CDI root {}",
                cdi_root.display()
            ),
            "Add the plugin's --cdi-root to cdi_spec_dirs under [crio.runtime], or set --cdi-root to one of them",
            "container-runtime",
        );
    }
    Check::ok(
        CHECK,
        format!("CRI-O ({file}): CDI enabled (always on since 1.23)"),
    )
}

fn quoted(section: &str) -> String {
    match section.split_once('.') {
        Some((head, rest)) => format!("{head}.\"{rest}\""),
        None => section.to_string(),
    }
}

/// `/var/run/x` and `/run/x` are one directory on every distribution (`/var/run` links to
/// `/run`); trailing slashes do not matter.
fn same_dir(a: &Path, b: &Path) -> bool {
    let norm = |p: &Path| {
        let s = p.to_string_lossy();
        let s = s.trim_end_matches('/');
        s.strip_prefix("/var")
            .filter(|r| r.starts_with("/run"))
            .unwrap_or(s)
            .to_string()
    };
    norm(a) == norm(b)
}

fn parse_string_array(value: &str) -> Vec<String> {
    value
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|s| s.trim().trim_matches(['"', '\'']).to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The few parts of TOML runtime configs use: `[section]` headers (quotes dropped, so
/// `plugins."io.containerd.grpc.v1.cri"` is `plugins.io.containerd.grpc.v1.cri`), `key =
/// value` with the value's text (arrays may span lines), comments.
struct Toml {
    values: BTreeMap<(String, String), String>,
}

impl Toml {
    fn parse(text: &str) -> Toml {
        let mut values = BTreeMap::new();
        let mut section = String::new();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            let line = strip_comment(line).trim();
            if line.starts_with('[') && !line.contains('=') {
                section = line
                    .trim_matches(['[', ']'])
                    .chars()
                    .filter(|c| !matches!(c, '"' | '\'' | ' '))
                    .collect();
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let mut value = value.trim().to_string();
            if value.starts_with('[') {
                while !value.contains(']') {
                    match lines.next() {
                        Some(more) => value.push_str(strip_comment(more).trim()),
                        None => break,
                    }
                }
            }
            let key = key.trim().trim_matches(['"', '\'']).to_string();
            values.insert((section.clone(), key), value.trim_matches('"').to_string());
        }
        Toml { values }
    }

    fn get(&self, section: &str, key: &str) -> Option<&str> {
        self.values
            .get(&(section.to_string(), key.to_string()))
            .map(String::as_str)
    }
}

fn strip_comment(line: &str) -> &str {
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted => return &line[..i],
            _ => {}
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;

    fn containerd_only(text: &str) -> RuntimeConfigs {
        RuntimeConfigs {
            containerd: Some(("/etc/containerd/config.toml".into(), text.into())),
            crio: vec![],
        }
    }

    fn status(configs: &RuntimeConfigs) -> (Status, String) {
        let c = check(configs, Path::new("/var/run/cdi"));
        (c.status, c.found)
    }

    #[test]
    fn containerd_2_has_cdi_on_unless_turned_off() {
        let on = containerd_only(
            "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_selinux = false\n",
        );
        let off = containerd_only(
            "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\n  enable_cdi = false # no\n",
        );
        assert_eq!(status(&on).0, Status::Ok);
        assert_eq!(status(&off).0, Status::Fail);
        assert!(
            status(&off).1.contains("enable_cdi = false"),
            "{}",
            status(&off).1
        );
    }

    #[test]
    fn containerd_1_7_needs_enable_cdi_under_the_cri_plugin() {
        let on = containerd_only(
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  enable_cdi = true\n  cdi_spec_dirs = [\"/etc/cdi\",\n    \"/run/cdi\"]\n",
        );
        let unset = containerd_only(
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause\"\n",
        );
        let elsewhere = containerd_only(
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri.containerd\"]\n  enable_cdi = true\n",
        );
        assert_eq!(status(&on).0, Status::Ok);
        assert_eq!(status(&unset).0, Status::Warn);
        assert_eq!(status(&elsewhere).0, Status::Warn);
    }

    #[test]
    fn spec_dirs_without_the_cdi_root_fail_naming_both() {
        let c = containerd_only(
            "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\n  cdi_spec_dirs = [\"/etc/cdi\"]\n",
        );
        let (s, found) = status(&c);
        assert_eq!(s, Status::Fail);
        assert!(
            found.contains("/etc/cdi") && found.contains("/var/run/cdi"),
            "{found}"
        );
    }

    #[test]
    fn crio_is_ok_and_its_drop_ins_override_spec_dirs() {
        let configs = RuntimeConfigs {
            containerd: None,
            crio: vec![
                (
                    "/etc/crio/crio.conf".into(),
                    "[crio.runtime]\ncdi_spec_dirs = [\"/etc/cdi\"]\n".into(),
                ),
                (
                    "/etc/crio/crio.conf.d/10-cdi.conf".into(),
                    "[crio.runtime]\ncdi_spec_dirs = [\"/etc/cdi\", \"/var/run/cdi\"]\n".into(),
                ),
            ],
        };
        assert_eq!(status(&configs).0, Status::Ok);
    }

    #[test]
    fn no_runtime_config_is_a_warning_saying_unknown() {
        let (s, found) = status(&RuntimeConfigs::default());
        assert_eq!(s, Status::Warn);
        assert!(found.starts_with("unknown"), "{found}");
    }

    #[test]
    fn configs_are_read_from_the_given_paths_with_crio_drop_ins_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let crio = tmp.path().join("crio.conf");
        std::fs::create_dir(tmp.path().join("crio.conf.d")).unwrap();
        std::fs::write(tmp.path().join("crio.conf.d/20-b.conf"), "b").unwrap();
        std::fs::write(tmp.path().join("crio.conf.d/10-a.conf"), "a").unwrap();
        std::fs::write(tmp.path().join("crio.conf.d/readme.txt"), "x").unwrap();
        let got = read_configs(&RuntimePaths {
            containerd: tmp.path().join("missing.toml"),
            crio,
        });
        let texts: Vec<&str> = got.crio.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!((got.containerd, texts), (None, vec!["a", "b"]));
    }
}
