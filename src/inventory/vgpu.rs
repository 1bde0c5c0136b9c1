//! The vGPU side of `gpu-dra inventory`: per GPU that reports vGPU support, how vGPUs are
//! created on it (framework, heterogeneous mode, virtual functions), the types it offers as
//! devices (`--vgpu-types`), the vGPUs that exist on the host now and the types NVML says
//! could be created now.
//!
//! [`rows`] computes the facts from a [`NodeView`]; [`table`] and [`comments`] print them.
//! Nothing is printed for a node whose GPUs report no vGPU and offer no vGPU devices, so the
//! output of other nodes keeps its shape.

use std::fmt::Write as _;

use super::NodeView;
use crate::devices::DeviceKind;
use crate::hardware::passthrough::normalize_address;
use crate::hardware::vgpu::{GpuVgpu, VgpuFramework};

/// What one GPU shows of vGPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VgpuRow {
    /// NVML index.
    pub index: u32,
    /// `mdev` or `vdev`; `None` when NVML reports no vGPU support (no vGPU manager, or a
    /// model without vGPU) although the GPU offers vGPU devices.
    pub framework: Option<VgpuFramework>,
    /// Whether types of different sizes may share the GPU (NVML's heterogeneous mode).
    pub heterogeneous: bool,
    /// vdev: virtual functions enabled and the most the GPU has (`virtfnN` links,
    /// `sriov_totalvfs`); `None` for mdev, or when the host's sysfs was not read or does not
    /// show the GPU.
    pub vfs: Option<(usize, u32)>,
    /// The types published as devices, each with its instance slots, in device order.
    pub offered: Vec<(String, usize)>,
    /// The vGPUs that exist on the host now, per type (sysfs); `None` when the host's sysfs
    /// was not read.
    pub active: Option<Vec<(String, usize)>>,
    /// The types NVML says one more vGPU could be created of now.
    pub creatable: Vec<String>,
}

/// `name×count` for each entry, `-` for none.
fn counted(entries: &[(String, usize)]) -> String {
    if entries.is_empty() {
        return "-".to_string();
    }
    let parts: Vec<String> = entries.iter().map(|(n, c)| format!("{n}×{c}")).collect();
    parts.join(",")
}

/// Adds one to `name`'s count, keeping first-seen order.
fn count(entries: &mut Vec<(String, usize)>, name: &str) {
    match entries.iter_mut().find(|(n, _)| n == name) {
        Some((_, c)) => *c += 1,
        None => entries.push((name.to_string(), 1)),
    }
}

/// The name of type `id` on a GPU, `type <id>` when NVML does not list it.
fn type_name(vgpu: Option<&GpuVgpu>, id: u32) -> String {
    vgpu.and_then(|v| v.type_by_id(id))
        .map(|t| t.short_name().to_string())
        .unwrap_or_else(|| format!("type {id}"))
}

/// One row per GPU that reports vGPU support or offers vGPU devices, in GPU order.
pub fn rows(view: &NodeView) -> Vec<VgpuRow> {
    let host = view.inventory.vgpu_host.as_ref();
    let mut out = Vec::new();
    for gpu in &view.inventory.gpus {
        let mut offered: Vec<(String, usize)> = Vec::new();
        for d in view
            .model
            .devices
            .iter()
            .filter(|d| d.gpu_index == gpu.index)
        {
            if let DeviceKind::Vgpu { type_name, .. } = &d.kind {
                count(&mut offered, type_name);
            }
        }
        let vgpu = gpu.vgpu.as_ref();
        if vgpu.is_none() && offered.is_empty() {
            continue;
        }
        let facts = host.and_then(|h| h.gpu(&normalize_address(&gpu.pci_bus_id)));
        let framework = vgpu.map(|v| v.framework);
        let vfs = match framework {
            Some(VgpuFramework::Vdev) => facts.map(|f| (f.vfs.len(), f.total_vfs)),
            _ => None,
        };
        let active = host.map(|_| {
            let mut active = Vec::new();
            for instance in facts.iter().flat_map(|f| &f.instances) {
                count(&mut active, &type_name(vgpu, instance.type_id));
            }
            active
        });
        out.push(VgpuRow {
            index: gpu.index,
            framework,
            heterogeneous: vgpu.is_some_and(|v| v.heterogeneous),
            vfs,
            offered,
            active,
            creatable: vgpu
                .iter()
                .flat_map(|v| v.creatable.iter().map(|id| type_name(Some(v), *id)))
                .collect(),
        });
    }
    out
}

impl VgpuRow {
    fn framework_text(&self) -> &'static str {
        self.framework.map_or("none", VgpuFramework::as_str)
    }

    fn vfs_text(&self) -> String {
        match (self.framework, self.vfs) {
            (Some(VgpuFramework::Vdev), Some((enabled, total))) => format!("{enabled}/{total}"),
            (Some(VgpuFramework::Vdev), None) => "?".to_string(),
            _ => "-".to_string(),
        }
    }

    fn active_text(&self) -> String {
        self.active
            .as_deref()
            .map_or_else(|| "?".to_string(), counted)
    }

    fn creatable_text(&self) -> String {
        match self.creatable.is_empty() {
            true => "-".to_string(),
            false => self.creatable.join(","),
        }
    }
}

/// The vGPU table (empty when [`rows`] is): framework, heterogeneous mode, VFs enabled of
/// the GPU's total, types offered as devices with their slots, vGPUs on the host now, types
/// creatable now. `?` where the host's sysfs was not read (NVML backend without
/// `--vgpu-types`) or does not show the GPU (a `--host-root` that is not the host's).
pub fn table(view: &NodeView) -> String {
    let rows = rows(view);
    if rows.is_empty() {
        return String::new();
    }
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.index.to_string(),
                r.framework_text().to_string(),
                if r.heterogeneous { "on" } else { "off" }.to_string(),
                r.vfs_text(),
                counted(&r.offered),
                r.active_text(),
                r.creatable_text(),
            ]
        })
        .collect();
    let header = [
        "VGPU",
        "FRAMEWORK",
        "HETERO",
        "VFS",
        "OFFERED",
        "ACTIVE",
        "CREATABLE",
    ];
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            let _ = write!(text, "{cell:<w$} ", w = widths[i]);
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in &cells {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// YAML comment lines with each [`rows`] entry, put before the slices by `-o yaml` (comments,
/// so `kubectl create -f -` still takes the output); empty when there are none.
pub fn comments(view: &NodeView) -> String {
    let mut out = String::new();
    for r in rows(view) {
        let _ = writeln!(
            out,
            "# gpu {} vgpu: framework {}, heterogeneous {}, VFs {}, offered {}, active {}, creatable {}",
            r.index,
            r.framework_text(),
            if r.heterogeneous { "on" } else { "off" },
            r.vfs_text(),
            counted(&r.offered),
            r.active_text(),
            r.creatable_text()
        );
    }
    out
}
