//! What a container reports about itself: a busybox `sh` script whose sections the test
//! parses, so assertions compare typed values rather than grep the output.

use std::collections::BTreeMap;

/// A device node as `stat` sees it inside the container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Node {
    /// `character special file`, `block special file`, …
    pub kind: String,
    pub major: u32,
    pub minor: u32,
    /// Permission bits, e.g. `0o666`.
    pub mode: u32,
}

/// Everything the container reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inside {
    pub env: BTreeMap<String, String>,
    /// `/dev/nvidia*` nodes (including `/dev/nvidia-caps/…`) and VFIO nodes (`/dev/vfio/…`,
    /// `/dev/iommu`) by path.
    pub nvidia_nodes: BTreeMap<String, Node>,
    /// Mount points (`/proc/self/mountinfo` field 5).
    pub mount_points: Vec<String>,
    /// Files under each listed directory: path → file type.
    pub files: BTreeMap<String, String>,
    /// Contents of the small regular files among them.
    pub contents: BTreeMap<String, String>,
}

/// The script: one `@section` line before each part.
pub fn script(dirs: &[&str]) -> String {
    let mut s = String::from(
        "echo @env; env\n\
         echo @nodes; find /dev -type c -o -type b | while read -r f; do \
         stat -c '%n|%F|%t|%T|%a' \"$f\"; done\n\
         echo @mounts; cat /proc/self/mountinfo\n",
    );
    for dir in dirs {
        s.push_str(&format!(
            "echo @dir; for f in '{dir}'/* '{dir}'/.[!.]*; do [ -e \"$f\" ] || continue; \
             stat -c '%n|%F' \"$f\"; \
             if [ -f \"$f\" ] && [ \"$(stat -c %s \"$f\")\" -lt 4096 ]; then \
             echo \"@content $f\"; cat \"$f\"; echo; echo @end; fi; done\n"
        ));
    }
    s
}

impl Inside {
    /// Parses the script's output.
    ///
    /// # Panics
    /// On a line the script cannot have printed.
    pub fn parse(out: &str) -> Inside {
        let mut inside = Inside::default();
        let mut section = "";
        let mut content: Option<(String, Vec<&str>)> = None;
        for line in out.lines() {
            if let Some((path, lines)) = &mut content {
                if line == "@end" {
                    let text = lines.join("\n");
                    inside.contents.insert(std::mem::take(path), text);
                    content = None;
                } else {
                    lines.push(line);
                }
                continue;
            }
            if let Some(path) = line.strip_prefix("@content ") {
                content = Some((path.to_string(), Vec::new()));
                continue;
            }
            if let Some(name) = line.strip_prefix('@') {
                section = match name {
                    "env" | "nodes" | "mounts" | "dir" => name,
                    _ => panic!("unknown section {line:?} in {out}"),
                };
                continue;
            }
            match section {
                "env" => {
                    if let Some((k, v)) = line.split_once('=') {
                        inside.env.insert(k.to_string(), v.to_string());
                    }
                }
                "nodes" => {
                    let f: Vec<&str> = line.split('|').collect();
                    assert_eq!(f.len(), 5, "bad node line {line:?}");
                    let gpu_node = f[0].starts_with("/dev/nvidia")
                        || f[0].starts_with("/dev/vfio/")
                        || f[0] == "/dev/iommu";
                    if gpu_node {
                        let hex = |s: &str| u32::from_str_radix(s, 16).expect("hex number");
                        let node = Node {
                            kind: f[1].to_string(),
                            major: hex(f[2]),
                            minor: hex(f[3]),
                            mode: u32::from_str_radix(f[4], 8).expect("octal mode"),
                        };
                        inside.nvidia_nodes.insert(f[0].to_string(), node);
                    }
                }
                "mounts" => {
                    if let Some(point) = line.split(' ').nth(4) {
                        inside.mount_points.push(point.to_string());
                    }
                }
                "dir" => {
                    let (path, kind) = line.split_once('|').expect("path|type");
                    inside.files.insert(path.to_string(), kind.to_string());
                }
                _ => panic!("output before the first section: {line:?}"),
            }
        }
        inside
    }

    /// The values of every `DRA_GPU_UUID_*` variable, sorted.
    pub fn uuids(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .env
            .iter()
            .filter(|(k, _)| k.starts_with("DRA_GPU_UUID_"))
            .map(|(_, v)| v.clone())
            .collect();
        v.sort();
        v
    }
}

#[test]
fn the_parser_reads_every_section() {
    let out = "@env\nA=1\nB=x=y\n@nodes\n/dev/null|character special file|1|3|666\n\
               /dev/nvidia1|character special file|c3|1|666\n@mounts\n\
               1 2 0:3 / /tmp/nvidia-mps rw - tmpfs x rw\n@dir\n/tmp/nvidia-mps/control|socket\n\
               /tmp/nvidia-mps/pid|regular file\n@content /tmp/nvidia-mps/pid\n42\n\n@end\n";
    let got = Inside::parse(out);
    let want = Inside {
        env: [("A", "1"), ("B", "x=y")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        nvidia_nodes: [(
            "/dev/nvidia1".to_string(),
            Node {
                kind: "character special file".into(),
                major: 195,
                minor: 1,
                mode: 0o666,
            },
        )]
        .into(),
        mount_points: vec!["/tmp/nvidia-mps".into()],
        files: [
            ("/tmp/nvidia-mps/control".to_string(), "socket".to_string()),
            (
                "/tmp/nvidia-mps/pid".to_string(),
                "regular file".to_string(),
            ),
        ]
        .into(),
        contents: [("/tmp/nvidia-mps/pid".to_string(), "42\n".to_string())].into(),
    };
    assert_eq!(got, want);
}
