//! The capacity report as tables for people: summaries first (cluster, profiles, pools, one
//! line per node), then who holds what, bounded unless asked for in full, then per-GPU
//! detail on request.

use std::fmt::Write;

use super::{CapacityReport, FULL_GPU, GpuCapacity, Holder, MigMode, ProfileSummary};

/// How much of the report the table shows.
#[derive(Clone, Copy, Debug)]
pub struct TableOptions {
    /// Every allocation and every GPU's layout and free placements.
    pub detail: bool,
    /// Without `detail`, at most this many allocation rows.
    pub max_allocations: usize,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            detail: false,
            max_allocations: 50,
        }
    }
}

/// Left-aligned columns, two spaces apart.
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i + 1 == widths.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}

fn profile_rows(profiles: &[ProfileSummary]) -> Vec<Vec<String>> {
    profiles
        .iter()
        .map(|p| {
            vec![
                p.profile.clone(),
                p.models.join(", "),
                p.capacity.to_string(),
                p.allocated.to_string(),
                p.free.to_string(),
            ]
        })
        .collect()
}

/// One token per GPU: the memory-slice map with dynamic MIG (`#` used, `.` free), `m<held>/<n>`
/// with static MIG, `#` or `.` for a full GPU; a GPU offering vGPU types shows `v<held>` (its
/// vGPUs in use) instead of `.`, or after its memory-slice map when it holds any.
fn gpu_token(gpu: &GpuCapacity) -> String {
    let vgpus: usize = gpu.vgpu.iter().map(|t| t.in_use).sum();
    match gpu.mig {
        MigMode::Dynamic => {
            let map: String = gpu
                .layout
                .as_deref()
                .unwrap_or("")
                .chars()
                .map(|c| if c == '.' { '.' } else { '#' })
                .collect();
            match vgpus {
                0 => map,
                n => format!("{map}+v{n}"),
            }
        }
        MigMode::Static => {
            let total = gpu.allocated.len()
                + gpu
                    .free
                    .iter()
                    .filter(|f| f.profile != FULL_GPU)
                    .map(|f| f.count)
                    .sum::<usize>();
            format!("m{}/{total}", gpu.allocated.len())
        }
        MigMode::Off if gpu.allocated.len() > vgpus => "#".into(),
        MigMode::Off if !gpu.vgpu.is_empty() => format!("v{vgpus}"),
        MigMode::Off if gpu.allocated.is_empty() => ".".into(),
        MigMode::Off => "#".into(),
    }
}

fn holder_cells(holder: &Holder) -> [String; 3] {
    let pods = if holder.pods.is_empty() {
        "-".to_string()
    } else {
        holder.pods.join(",")
    };
    let claim = match &holder.share_id {
        Some(share) => format!("{} (share {share})", holder.claim),
        None => holder.claim.clone(),
    };
    [holder.namespace.clone(), pods, claim]
}

fn placement_text(start: u32, size: Option<u32>) -> String {
    match size {
        Some(1) => start.to_string(),
        Some(n) => format!("{start}-{}", start + n - 1),
        None => format!("{start}"),
    }
}

/// Memory slices as ranges: `0-3,5,7`.
pub(super) fn slice_list(slices: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < slices.len() {
        let mut j = i;
        while j + 1 < slices.len() && slices[j + 1] == slices[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            slices[i].to_string()
        } else {
            format!("{}-{}", slices[i], slices[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Renders `report` as text tables.
pub fn render_table(report: &CapacityReport, options: &TableOptions) -> String {
    let mut out = String::new();
    let t = &report.totals;
    let _ = writeln!(
        out,
        "Cluster ({}): {} node(s), {} GPU(s), {} busy; {} device(s) held by {} claim(s) in {} namespace(s)",
        report.driver, t.nodes, t.gpus, t.busy_gpus, t.allocated_devices, t.claims, t.namespaces
    );
    for warning in &report.warnings {
        let _ = writeln!(out, "warning: {warning}");
    }
    out.push_str(
        "\nPROFILES (free: what a request could still get, counters and placements considered)\n",
    );
    table(
        &mut out,
        &["PROFILE", "MODELS", "CAPACITY", "ALLOCATED", "FREE"],
        &profile_rows(&report.profiles),
    );
    if let Some(label) = &report.pool_label {
        let _ = writeln!(out, "\nPOOLS (node label {label})");
        let rows: Vec<Vec<String>> = report
            .pools
            .iter()
            .flat_map(|pool| {
                pool.profiles.iter().enumerate().map(move |(i, p)| {
                    let first = i == 0;
                    let cell = |s: String| if first { s } else { String::new() };
                    vec![
                        cell(pool.pool.clone()),
                        cell(pool.nodes.to_string()),
                        cell(format!("{}/{}", pool.busy_gpus, pool.gpus)),
                        p.profile.clone(),
                        p.capacity.to_string(),
                        p.allocated.to_string(),
                        p.free.to_string(),
                    ]
                })
            })
            .collect();
        table(
            &mut out,
            &[
                "POOL",
                "NODES",
                "BUSY/GPUS",
                "PROFILE",
                "CAPACITY",
                "ALLOCATED",
                "FREE",
            ],
            &rows,
        );
    }
    out.push_str(&nodes_heading(report));
    let rows: Vec<Vec<String>> = report
        .nodes
        .iter()
        .map(|node| {
            let mut models: Vec<&str> = node.gpus.iter().map(|g| g.model.as_str()).collect();
            models.dedup();
            let busy = node.gpus.iter().filter(|g| !g.allocated.is_empty()).count();
            let held: usize = node.gpus.iter().map(|g| g.allocated.len()).sum();
            let layout: Vec<String> = node.gpus.iter().map(gpu_token).collect();
            let mut row = vec![node.name.clone()];
            if report.pool_label.is_some() {
                row.push(node.pool.clone().unwrap_or_default());
            }
            row.extend([
                format!("{busy}/{}", node.gpus.len()),
                held.to_string(),
                models.join(", "),
                layout.join(" "),
            ]);
            row
        })
        .collect();
    let mut header = vec!["NODE"];
    if report.pool_label.is_some() {
        header.push("POOL");
    }
    header.extend(["BUSY/GPUS", "HELD", "MODEL", "LAYOUT"]);
    table(&mut out, &header, &rows);
    allocations(&mut out, report, options);
    fragmentation(&mut out, report, options);
    if options.detail {
        gpus(&mut out, report);
    }
    out
}

/// The NODES heading with its legend; the vGPU token is explained only where a GPU offers
/// vGPU types, so the tables of other clusters keep their shape.
fn nodes_heading(report: &CapacityReport) -> String {
    let vgpu = report
        .nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .any(|g| !g.vgpu.is_empty());
    format!(
        "\nNODES (layout per GPU: memory slices '#' used '.' free; m<held>/<n> static MIG; '#'/'.' full GPU{})\n",
        if vgpu { "; v<n> vGPUs in use" } else { "" }
    )
}

fn allocations(out: &mut String, report: &CapacityReport, options: &TableOptions) {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for node in &report.nodes {
        for gpu in &node.gpus {
            for a in &gpu.allocated {
                for holder in &a.holders {
                    let placement = a
                        .placement
                        .map(|p| placement_text(p.start, p.size))
                        .unwrap_or_else(|| "-".into());
                    let mut row = vec![
                        node.name.clone(),
                        gpu.name.clone(),
                        a.device.clone(),
                        a.profile.clone(),
                        placement,
                    ];
                    row.extend(holder_cells(holder));
                    rows.push(row);
                }
            }
        }
    }
    if rows.is_empty() {
        out.push_str("\nALLOCATIONS: none\n");
        return;
    }
    let total = rows.len();
    if !options.detail && total > options.max_allocations {
        rows.truncate(options.max_allocations);
    }
    out.push_str("\nALLOCATIONS\n");
    table(
        out,
        &[
            "NODE",
            "GPU",
            "DEVICE",
            "PROFILE",
            "SLICES",
            "NAMESPACE",
            "POD",
            "CLAIM",
        ],
        &rows,
    );
    if rows.len() < total {
        let _ = writeln!(
            out,
            "… {} more (--detail shows all; -o json or yaml for scripts; --node NAME for one node)",
            total - rows.len()
        );
    }
}

/// GPUs on which a MIG profile no longer fits although enough memory slices are free: the
/// profile, and which allocations are in its way.
fn fragmentation(out: &mut String, report: &CapacityReport, options: &TableOptions) {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for node in &report.nodes {
        for gpu in &node.gpus {
            let free = gpu.free_memory_slices.as_deref().unwrap_or_default();
            for b in &gpu.blocked {
                if (free.len() as u32) < b.placement.size.unwrap_or(u32::MAX) {
                    continue;
                }
                rows.push(vec![
                    node.name.clone(),
                    gpu.name.clone(),
                    slice_list(free),
                    b.to_string(),
                ]);
            }
        }
    }
    if rows.is_empty() {
        return;
    }
    let total = rows.len();
    if !options.detail && total > options.max_allocations {
        rows.truncate(options.max_allocations);
    }
    out.push_str(
        "\nFRAGMENTED (profiles that no longer fit although enough memory slices are free)\n",
    );
    table(out, &["NODE", "GPU", "FREE SLICES", "BLOCKED"], &rows);
    if rows.len() < total {
        let _ = writeln!(out, "… {} more (--detail shows all)", total - rows.len());
    }
}

fn gpus(out: &mut String, report: &CapacityReport) {
    out.push_str("\nGPUS (layout letters are the allocations listed under each GPU)\n");
    for node in &report.nodes {
        for gpu in &node.gpus {
            let _ = writeln!(
                out,
                "{}/{}  {}  MIG {}{}",
                node.name,
                gpu.name,
                gpu.model,
                gpu.mig.as_str(),
                gpu.layout
                    .as_deref()
                    .map(|l| format!("  [{l}]"))
                    .unwrap_or_default()
            );
            for (i, a) in gpu.allocated.iter().enumerate() {
                let letter = if gpu.mig == MigMode::Dynamic {
                    format!("{} ", char::from(super::book::letter(i)))
                } else {
                    String::new()
                };
                for holder in &a.holders {
                    let [ns, pods, claim] = holder_cells(holder);
                    let _ = writeln!(
                        out,
                        "  {letter}{} ({}) held by {ns}/{claim}, pods {pods}",
                        a.device, a.profile
                    );
                }
            }
            let free: Vec<String> = gpu
                .free
                .iter()
                .filter(|f| f.count > 0)
                .map(|f| {
                    if f.starts.is_empty() {
                        format!("{}×{}", f.profile, f.count)
                    } else {
                        let starts: Vec<String> = f.starts.iter().map(u32::to_string).collect();
                        format!("{}×{}@{}", f.profile, f.count, starts.join(","))
                    }
                })
                .collect();
            let _ = writeln!(
                out,
                "  free: {}",
                if free.is_empty() {
                    "nothing".to_string()
                } else {
                    free.join(" ")
                }
            );
            for t in &gpu.vgpu {
                let _ = writeln!(
                    out,
                    "  vGPU {}: {} of {} slots in use{}, {} free",
                    t.vgpu_type,
                    t.in_use,
                    t.slots,
                    match t.claims.is_empty() {
                        true => String::new(),
                        false => format!(" ({})", t.claims.join(", ")),
                    },
                    t.free
                );
            }
            if let Some(slices) = &gpu.free_memory_slices {
                let _ = writeln!(
                    out,
                    "  free memory slices: {}",
                    if slices.is_empty() {
                        "none".to_string()
                    } else {
                        slice_list(slices)
                    }
                );
            }
            for b in &gpu.blocked {
                let _ = writeln!(out, "  {b}");
            }
        }
    }
}
