//! The host's vGPUs through sysfs under a host root (`--host-root`): what exists
//! ([`VgpuHost::scan`]), the four writes that create and delete vGPUs, and an mdev's
//! `vgpu_params`.
//!
//! Files read, per NVIDIA GPU physical function `<pf>` under `<root>/sys/bus/pci/devices/`:
//! `sriov_totalvfs`, `sriov_numvfs`, `virtfn<N>` (links to the VFs); per VF `physfn`,
//! `iommu_group`, `nvidia/{creatable_vgpu_types,current_vgpu_type}`; per mdev parent
//! `mdev_supported_types/nvidia-<id>/{name,available_instances,create}`; and every
//! `<root>/sys/bus/mdev/devices/<uuid>/{mdev_type,iommu_group,remove,nvidia/vgpu_params}`.
//! Writes go through the same [`SysfsKernel`] as VFIO's driver switch, so this code runs
//! unchanged on a host and on the simulated node ([`crate::hardware::sim::sysfs::SimKernel`]).
//!
//! Every operation checks before it writes and refuses with what to do (VFs not enabled, a
//! type the GPU cannot create beside what it runs, no free VF), and is idempotent where the
//! hardware allows it: creating what already exists, deleting a free VF or removing an absent
//! mdev writes nothing. A crash point sits between each write and its check
//! ([`CRASH_POINTS`]), so crash tests can stop the process with the write done and unchecked.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

mod error;
mod pick;

pub use error::VgpuHostError;
use pick::list_labels;
pub use pick::{TypeNames, check_mdev, check_vdev, describe_in_use, pick_vf};

use super::{GpuVgpuHost, MdevType, VgpuHostFacts, VgpuInstance, VirtualFunction};
use crate::hardware::passthrough::{PassthroughError, PciHost, SysfsKernel, normalize_address};

/// Where the NVIDIA vGPU manager's `sriov-manage` lives; its `-e <address>` enables a GPU's VFs.
pub const SRIOV_MANAGE: &str = "/usr/lib/nvidia/sriov-manage";

/// The crash points of vGPU writes, each between a write and its check, in the order a
/// create and a delete pass them.
pub const CRASH_POINTS: &[&str] = &[
    "vgpu-vdev-written",
    "vgpu-vdev-deleted",
    "vgpu-mdev-created",
    "vgpu-mdev-removed",
];

/// One mdev as `/sys/bus/mdev/devices/<uuid>` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mdev {
    uuid: String,
    parent: String,
    type_id: u32,
    iommu_group: Option<String>,
}

fn io(path: &Path, step: &'static str) -> impl FnOnce(std::io::Error) -> VgpuHostError {
    let path = path.to_path_buf();
    move |source| VgpuHostError::Io { path, step, source }
}

fn link_name(path: &Path) -> Option<String> {
    std::fs::read_link(path)
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

fn read_u32(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Entries of `dir`, by name; none when it does not exist.
fn entries(dir: &Path) -> Result<Vec<String>, VgpuHostError> {
    crate::cost::count(crate::cost::Cost::DirectoryList);
    match std::fs::read_dir(dir) {
        Ok(list) => {
            let mut names = Vec::new();
            for entry in list {
                let entry = entry.map_err(io(dir, "listing"))?;
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
            names.sort();
            Ok(names)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io(dir, "listing")(e)),
    }
}

/// The host's vGPU files under a root directory, and the kernel that acts on its writes.
#[derive(Debug)]
pub struct VgpuHost {
    root: PathBuf,
    kernel: Arc<dyn SysfsKernel>,
    pci: PciHost,
    /// Bumped by every write: NVML's view of the node changes with it.
    changes: AtomicU64,
    /// GPUs (physical-function addresses) this process wrote to, or found changed behind
    /// its back, since [`VgpuHost::refresh`] last read them again.
    dirty: Mutex<BTreeSet<String>>,
}

impl VgpuHost {
    /// The vGPU files under `root` (`/` on a host, the chart's `/host-root`, or a simulated
    /// node's tree), written through `kernel`.
    pub fn new(root: impl Into<PathBuf>, kernel: Arc<dyn SysfsKernel>) -> VgpuHost {
        let root = root.into();
        VgpuHost {
            pci: PciHost::new(root.clone(), Arc::clone(&kernel)),
            root,
            kernel,
            changes: AtomicU64::new(0),
            dirty: Mutex::default(),
        }
    }

    /// The host root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// How many vGPU writes this host has made (a generation for inventory polling).
    pub fn change_count(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    fn device(&self, address: &str) -> PathBuf {
        self.root.join("sys/bus/pci/devices").join(address)
    }

    fn mdev_device(&self, uuid: &str) -> PathBuf {
        self.root.join("sys/bus/mdev/devices").join(uuid)
    }

    /// Every NVIDIA GPU physical function with its VFs, mdev types and vGPUs, in address
    /// order. A GPU without vGPU support is listed with nothing (0 VFs, no types). A host
    /// without a PCI bus directory has no GPUs.
    ///
    /// # Errors
    /// [`VgpuHostError::Io`] when a directory exists but cannot be listed.
    pub fn scan(&self) -> Result<VgpuHostFacts, VgpuHostError> {
        let pci = self.pci.scan().map_err(|e| match e {
            PassthroughError::Io { path, step, source } => VgpuHostError::Io { path, step, source },
            other => io(&self.root.join("sys/bus/pci/devices"), "listing")(std::io::Error::other(
                other.to_string(),
            )),
        })?;
        let mdevs = self.mdevs()?;
        let mut gpus = Vec::new();
        for gpu in &pci.gpus {
            gpus.push(self.read_pf(&gpu.address, &mdevs, &mut TypeNames::default())?);
        }
        Ok(VgpuHostFacts { gpus })
    }

    /// Brings `facts` (an earlier [`VgpuHost::scan`]) up to date for every GPU this host
    /// wrote to since, or found changed when a create was refused: each is read again (its
    /// VFs, mdev types and vGPUs), nothing else is. What others changed on GPUs this process
    /// did not touch stays as `facts` has it: a caller that must see those scans again.
    ///
    /// # Errors
    /// As [`VgpuHost::scan`]; the GPUs not yet read again stay marked, so a retry reads them.
    pub fn refresh(&self, facts: &mut VgpuHostFacts) -> Result<(), VgpuHostError> {
        let dirty = std::mem::take(&mut *self.dirty_set());
        if dirty.is_empty() {
            return Ok(());
        }
        let read = (|| {
            let mdevs = self.mdevs()?;
            let mut fresh = Vec::with_capacity(dirty.len());
            for address in &dirty {
                if self.pci.read_gpu(address).is_some() {
                    fresh.push(self.read_pf(address, &mdevs, &mut TypeNames::default())?);
                }
            }
            Ok(fresh)
        })();
        let fresh = match read {
            Ok(fresh) => fresh,
            Err(e) => {
                self.dirty_set().extend(dirty);
                return Err(e);
            }
        };
        facts.gpus.retain(|g| !dirty.contains(&g.address));
        facts.gpus.extend(fresh);
        facts.gpus.sort_by(|a, b| a.address.cmp(&b.address));
        Ok(())
    }

    /// Forgets every GPU marked for [`VgpuHost::refresh`]: a full [`VgpuHost::scan`] is about
    /// to read them all.
    pub fn clear_dirty(&self) {
        self.dirty_set().clear();
    }

    fn dirty_set(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.dirty
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn mark_dirty(&self, pf: &str) {
        self.dirty_set().insert(pf.to_string());
    }

    /// The vGPU side of GPU `address` (normalised) now.
    ///
    /// # Errors
    /// [`VgpuHostError::NoSuchGpu`] when no NVIDIA GPU physical function is there;
    /// [`VgpuHostError::Io`] for a directory that cannot be listed.
    pub fn gpu(&self, address: &str) -> Result<GpuVgpuHost, VgpuHostError> {
        self.gpu_named(address).map(|(gpu, _)| gpu)
    }

    fn gpu_named(&self, address: &str) -> Result<(GpuVgpuHost, TypeNames), VgpuHostError> {
        let address = normalize_address(address);
        if self.pci.read_gpu(&address).is_none() {
            return Err(VgpuHostError::NoSuchGpu {
                address,
                root: self.root.clone(),
            });
        }
        let mut names = TypeNames::default();
        let gpu = self.read_pf(&address, &self.mdevs()?, &mut names)?;
        Ok((gpu, names))
    }

    /// Where a vdev vGPU of `type_id` would go on GPU `parent` now ([`check_vdev`] on what
    /// sysfs shows). Reads only.
    ///
    /// # Errors
    /// As [`VgpuHost::gpu`] and [`check_vdev`]; `names` label the types in messages.
    pub fn vf_for(
        &self,
        parent: &str,
        type_id: u32,
        names: &TypeNames,
    ) -> Result<VirtualFunction, VgpuHostError> {
        let (gpu, mut read) = self.gpu_named(parent)?;
        read.extend(names);
        check_vdev(&gpu, type_id, &read).cloned()
    }

    fn read_pf(
        &self,
        address: &str,
        mdevs: &[Mdev],
        names: &mut TypeNames,
    ) -> Result<GpuVgpuHost, VgpuHostError> {
        let dev = self.device(address);
        let mut vfs = Vec::new();
        for entry in entries(&dev)? {
            let Some(number) = entry
                .strip_prefix("virtfn")
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Some(vf) = link_name(&dev.join(&entry)) else {
                continue;
            };
            vfs.push(self.read_vf(&normalize_address(&vf), number, names));
        }
        vfs.sort_by_key(|vf| vf.number);
        let mut mdev_types = Vec::new();
        let types_dir = dev.join("mdev_supported_types");
        for entry in entries(&types_dir)? {
            let Some(id) = entry
                .strip_prefix("nvidia-")
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let dir = types_dir.join(&entry);
            let name = std::fs::read_to_string(dir.join("name"))
                .map(|n| n.trim().to_string())
                .unwrap_or_default();
            names.add(id, &name);
            mdev_types.push(MdevType {
                id,
                name,
                available: read_u32(&dir.join("available_instances")).unwrap_or(0),
            });
        }
        mdev_types.sort_by_key(|t| t.id);
        let mut instances: Vec<VgpuInstance> = vfs
            .iter()
            .filter(|vf| vf.current_type != 0)
            .map(|vf| VgpuInstance {
                type_id: vf.current_type,
                vf_address: Some(vf.address.clone()),
                mdev_uuid: None,
                iommu_group: vf.iommu_group.clone(),
            })
            .collect();
        instances.extend(
            mdevs
                .iter()
                .filter(|m| m.parent == address || vfs.iter().any(|vf| vf.address == m.parent))
                .map(|m| VgpuInstance {
                    type_id: m.type_id,
                    vf_address: None,
                    mdev_uuid: Some(m.uuid.clone()),
                    iommu_group: m.iommu_group.clone(),
                }),
        );
        Ok(GpuVgpuHost {
            address: address.to_string(),
            total_vfs: read_u32(&dev.join("sriov_totalvfs")).unwrap_or(0),
            vfs,
            mdev_types,
            instances,
        })
    }

    fn read_vf(&self, address: &str, number: u32, names: &mut TypeNames) -> VirtualFunction {
        let dev = self.device(address);
        let text =
            std::fs::read_to_string(dev.join("nvidia/creatable_vgpu_types")).unwrap_or_default();
        let creatable = super::parse_creatable(&text)
            .into_iter()
            .map(|(id, name)| {
                names.add(id, &name);
                id
            })
            .collect();
        VirtualFunction {
            address: address.to_string(),
            number,
            iommu_group: link_name(&dev.join("iommu_group")),
            current_type: read_u32(&dev.join("nvidia/current_vgpu_type")).unwrap_or(0),
            creatable,
        }
    }

    /// Every mdev on the host, with its parent (the device its directory sits under).
    fn mdevs(&self) -> Result<Vec<Mdev>, VgpuHostError> {
        let dir = self.root.join("sys/bus/mdev/devices");
        let mut out = Vec::new();
        for uuid in entries(&dir)? {
            if let Some(m) = self.read_mdev(&uuid) {
                out.push(m);
            }
        }
        Ok(out)
    }

    fn read_mdev(&self, uuid: &str) -> Option<Mdev> {
        let dev = self.mdev_device(uuid);
        let real = dev.canonicalize().ok()?;
        let parent = real.parent()?.file_name()?.to_string_lossy().into_owned();
        let type_id = link_name(&dev.join("mdev_type"))?
            .strip_prefix("nvidia-")?
            .parse()
            .ok()?;
        Some(Mdev {
            uuid: uuid.to_string(),
            parent: normalize_address(&parent),
            type_id,
            iommu_group: link_name(&dev.join("iommu_group")),
        })
    }

    /// The VF at `vf` and its physical function, or [`VgpuHostError::NoSuchVf`].
    fn require_vf(&self, vf: &str) -> Result<(String, PathBuf), VgpuHostError> {
        let vf = normalize_address(vf);
        let dev = self.device(&vf);
        let pf = link_name(&dev.join("physfn"));
        match pf {
            Some(pf) if dev.join("nvidia/current_vgpu_type").exists() => {
                Ok((normalize_address(&pf), dev))
            }
            _ => Err(VgpuHostError::NoSuchVf {
                address: vf,
                root: self.root.clone(),
            }),
        }
    }

    fn current_type(dev: &Path) -> Result<u32, VgpuHostError> {
        let path = dev.join("nvidia/current_vgpu_type");
        let text = std::fs::read_to_string(&path).map_err(io(&path, "reading"))?;
        text.trim().parse().map_err(|_| {
            io(&path, "parsing")(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{:?} is not a type ID", text.trim()),
            ))
        })
    }

    /// Writes `value` to `path` through the kernel. `pf`: the GPU whose vGPUs the write
    /// changes, which [`VgpuHost::refresh`] then reads again whatever the kernel answered;
    /// `None` for a write that changes no fact a scan reads (`vgpu_params`).
    fn write(&self, pf: Option<&str>, path: &Path, value: &str) -> Result<(), VgpuHostError> {
        crate::cost::count(crate::cost::Cost::SysfsWrite);
        let result = self.kernel.write(path, value);
        self.changes.fetch_add(1, Ordering::Relaxed);
        if let Some(pf) = pf {
            self.mark_dirty(pf);
        }
        result.map_err(|source| VgpuHostError::Write {
            path: path.to_path_buf(),
            value: value.to_string(),
            source,
        })
    }

    /// Creates a vGPU of `type_id` on virtual function `vf`: writes the ID to
    /// `nvidia/current_vgpu_type` and reads it back. Idempotent: a VF that already holds
    /// `type_id` is left as it is. Crash point `vgpu-vdev-written` between the write and the
    /// read-back.
    ///
    /// # Errors
    /// Before anything is written: [`VgpuHostError::NoSuchVf`], [`VgpuHostError::VfBusy`]
    /// (another type on the VF), [`VgpuHostError::TypeNotCreatable`] (not in the VF's
    /// creatable list, naming what the GPU runs). Then [`VgpuHostError::Write`] when the
    /// kernel refuses, [`VgpuHostError::VdevDidNotTake`] when the read-back differs. Types
    /// are named as sysfs names them (`type <id>` for one no list prints); check first with
    /// [`VgpuHost::vf_for`] to name them as NVML does.
    pub fn create_vdev(&self, vf: &str, type_id: u32) -> Result<VgpuInstance, VgpuHostError> {
        let (pf, dev) = self.require_vf(vf)?;
        let vf = normalize_address(vf);
        let instance = VgpuInstance {
            type_id,
            vf_address: Some(vf.clone()),
            mdev_uuid: None,
            iommu_group: link_name(&dev.join("iommu_group")),
        };
        let current = Self::current_type(&dev)?;
        if current == type_id {
            return Ok(instance);
        }
        let creatable = self.read_vf(&vf, 0, &mut TypeNames::default()).creatable;
        if current != 0 || !creatable.contains(&type_id) {
            // What the caller checked against is out of date: read the GPU again next time.
            self.mark_dirty(&pf);
            let (gpu, names) = self.gpu_named(&pf)?;
            if current != 0 {
                return Err(VgpuHostError::VfBusy {
                    vf,
                    current,
                    current_name: names.label(current),
                    wanted: type_id,
                });
            }
            let free = gpu.vfs.iter().filter(|v| v.current_type == 0);
            return Err(VgpuHostError::TypeNotCreatable {
                vf: Some(vf),
                type_id,
                type_name: names.label(type_id),
                in_use: describe_in_use(&gpu, &names),
                creatable: list_labels(free.flat_map(|v| v.creatable.iter().copied()), &names),
                gpu: pf,
            });
        }
        self.write(
            Some(&pf),
            &dev.join("nvidia/current_vgpu_type"),
            &type_id.to_string(),
        )?;
        crate::crashpoint::hit("vgpu-vdev-written");
        let found = Self::current_type(&dev)?;
        if found != type_id {
            return Err(VgpuHostError::VdevDidNotTake {
                vf,
                wanted: type_id,
                found,
            });
        }
        Ok(instance)
    }

    /// Deletes the vGPU on virtual function `vf`: writes `0` to `nvidia/current_vgpu_type`
    /// and reads it back. Idempotent: a free VF is left as it is, and a VF that no longer
    /// exists (the VFs were disabled, `sriov-manage -d`, which destroys their vGPUs) has no
    /// vGPU left to delete. Crash point `vgpu-vdev-deleted` between the write and the
    /// read-back.
    ///
    /// # Errors
    /// [`VgpuHostError::NoSuchVf`] for a device that exists but is not an NVIDIA vGPU VF;
    /// [`VgpuHostError::Write`] when the kernel refuses (a VM still holds the vGPU);
    /// [`VgpuHostError::VdevDidNotTake`] when it still reads a type.
    pub fn delete_vdev(&self, vf: &str) -> Result<(), VgpuHostError> {
        if self
            .device(&normalize_address(vf))
            .symlink_metadata()
            .is_err()
        {
            return Ok(());
        }
        let (pf, dev) = self.require_vf(vf)?;
        if Self::current_type(&dev)? == 0 {
            return Ok(());
        }
        self.write(Some(&pf), &dev.join("nvidia/current_vgpu_type"), "0")?;
        crate::crashpoint::hit("vgpu-vdev-deleted");
        let found = Self::current_type(&dev)?;
        if found != 0 {
            return Err(VgpuHostError::VdevDidNotTake {
                vf: normalize_address(vf),
                wanted: 0,
                found,
            });
        }
        Ok(())
    }

    /// Creates mdev `uuid` of type `type_id` on `parent` (a GPU, or a VF on SR-IOV hosts
    /// still on mdev): writes the UUID to `mdev_supported_types/nvidia-<id>/create` and
    /// checks `/sys/bus/mdev/devices/<uuid>` appears with that type. Idempotent: an mdev of
    /// that UUID, type and parent is left as it is. Crash point `vgpu-mdev-created` between
    /// the write and the check.
    ///
    /// # Errors
    /// Before anything is written: [`VgpuHostError::BadUuid`], [`VgpuHostError::NoSuchGpu`],
    /// [`VgpuHostError::UuidTaken`], [`VgpuHostError::NoMdevType`],
    /// [`VgpuHostError::TypeNotCreatable`] (no instance available, naming what runs). Then
    /// [`VgpuHostError::Write`] when the kernel refuses, [`VgpuHostError::MdevDidNotAppear`].
    pub fn create_mdev(
        &self,
        parent: &str,
        type_id: u32,
        uuid: &str,
    ) -> Result<VgpuInstance, VgpuHostError> {
        if !super::is_uuid(uuid) {
            return Err(VgpuHostError::BadUuid { uuid: uuid.into() });
        }
        let uuid = uuid.to_ascii_lowercase();
        let parent = normalize_address(parent);
        let dev = self.device(&parent);
        if std::fs::read_to_string(dev.join("vendor"))
            .map(|v| v.trim() != crate::hardware::passthrough::NVIDIA_VENDOR)
            .unwrap_or(true)
        {
            return Err(VgpuHostError::NoSuchGpu {
                address: parent,
                root: self.root.clone(),
            });
        }
        let instance = |m: &Mdev| VgpuInstance {
            type_id: m.type_id,
            vf_address: None,
            mdev_uuid: Some(m.uuid.clone()),
            iommu_group: m.iommu_group.clone(),
        };
        if let Some(m) = self.read_mdev(&uuid) {
            if m.parent == parent && m.type_id == type_id {
                return Ok(instance(&m));
            }
            return Err(VgpuHostError::UuidTaken {
                uuid,
                parent,
                type_id,
                found_parent: m.parent,
                found_type: m.type_id,
            });
        }
        let pf = link_name(&dev.join("physfn")).unwrap_or_else(|| parent.clone());
        let (mut gpu, names) = self.gpu_named(&pf)?;
        if pf != parent {
            // A VF parent: its own types, the GPU's instances.
            gpu.mdev_types = self
                .read_pf(&parent, &[], &mut TypeNames::default())?
                .mdev_types;
            gpu.address = parent.clone();
        }
        if let Err(e) = check_mdev(&gpu, type_id, &names) {
            self.mark_dirty(&pf);
            return Err(e);
        }
        let create = dev.join(format!("mdev_supported_types/nvidia-{type_id}/create"));
        self.write(Some(&pf), &create, &uuid)?;
        crate::crashpoint::hit("vgpu-mdev-created");
        match self.read_mdev(&uuid) {
            Some(m) if m.parent == parent && m.type_id == type_id => Ok(instance(&m)),
            _ => Err(VgpuHostError::MdevDidNotAppear {
                uuid,
                parent,
                type_id,
            }),
        }
    }

    /// Sets mdev `uuid`'s vGPU parameters: writes `params` (`key=value` pairs separated by
    /// commas) to its `nvidia/vgpu_params` and reads them back. Idempotent: what reads back
    /// already is not written again. The vGPU manager reads them when a VM opens the vGPU, so
    /// call it between the create and the VM's start.
    ///
    /// # Errors
    /// [`VgpuHostError::BadUuid`]; [`VgpuHostError::NoParamsFile`] when the mdev or its
    /// `nvidia/vgpu_params` is absent; [`VgpuHostError::Write`] when the kernel refuses (a
    /// parameter it does not know); [`VgpuHostError::ParamsDidNotTake`].
    pub fn set_mdev_params(&self, uuid: &str, params: &str) -> Result<(), VgpuHostError> {
        if !super::is_uuid(uuid) {
            return Err(VgpuHostError::BadUuid { uuid: uuid.into() });
        }
        let uuid = uuid.to_ascii_lowercase();
        let file = self.mdev_device(&uuid).join("nvidia/vgpu_params");
        let read = || {
            std::fs::read_to_string(&file)
                .map(|t| t.trim().to_string())
                .map_err(|_| VgpuHostError::NoParamsFile { uuid: uuid.clone() })
        };
        if read()? == params {
            return Ok(());
        }
        self.write(None, &file, params)?;
        let found = read()?;
        if found != params {
            return Err(VgpuHostError::ParamsDidNotTake {
                uuid,
                wanted: params.to_string(),
                found,
            });
        }
        Ok(())
    }

    /// Removes mdev `uuid`: writes `1` to `/sys/bus/mdev/devices/<uuid>/remove` and checks
    /// it is gone. Idempotent: an absent mdev is left absent. Crash point
    /// `vgpu-mdev-removed` between the write and the check.
    ///
    /// # Errors
    /// [`VgpuHostError::BadUuid`]; [`VgpuHostError::Write`] when the kernel refuses (a VM
    /// still holds it); [`VgpuHostError::MdevNotRemoved`].
    pub fn remove_mdev(&self, uuid: &str) -> Result<(), VgpuHostError> {
        if !super::is_uuid(uuid) {
            return Err(VgpuHostError::BadUuid { uuid: uuid.into() });
        }
        let uuid = uuid.to_ascii_lowercase();
        let dev = self.mdev_device(&uuid);
        if dev.symlink_metadata().is_err() {
            return Ok(());
        }
        // The GPU it sits on: its parent, or the parent's physical function.
        let pf = self.read_mdev(&uuid).map(|m| {
            link_name(&self.device(&m.parent).join("physfn"))
                .map(|pf| normalize_address(&pf))
                .unwrap_or(m.parent)
        });
        self.write(pf.as_deref(), &dev.join("remove"), "1")?;
        crate::crashpoint::hit("vgpu-mdev-removed");
        if dev.symlink_metadata().is_ok() {
            return Err(VgpuHostError::MdevNotRemoved { uuid });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    use super::pick::tests::vf;

    /// A kernel that records every write and performs it as a plain file write.
    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<(PathBuf, String)>>);

    impl SysfsKernel for Recorder {
        fn write(&self, path: &Path, value: &str) -> std::io::Result<()> {
            self.0
                .lock()
                .unwrap()
                .push((path.to_path_buf(), value.to_string()));
            std::fs::write(path, value)
        }
    }

    fn put(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn ln(target: &str, at: &Path) {
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, at).unwrap();
    }

    /// A GPU at 0000:18:00.0 with two VFs (the first holding H100-4C) and a T4 at
    /// 0000:2a:00.0 with one mdev of type 232.
    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        let dev = |a: &str| sys.join("devices/pci0000:18").join(a);
        for (a, phys) in [
            ("0000:18:00.0", None),
            ("0000:18:00.4", Some("0000:18:00.0")),
            ("0000:18:00.5", Some("0000:18:00.0")),
            ("0000:2a:00.0", None),
        ] {
            put(&dev(a).join("vendor"), "0x10de\n");
            put(&dev(a).join("class"), "0x030200\n");
            ln(
                &format!("../../../devices/pci0000:18/{a}"),
                &sys.join("bus/pci/devices").join(a),
            );
            if let Some(pf) = phys {
                ln(&format!("../{pf}"), &dev(a).join("physfn"));
            }
        }
        put(&dev("0000:18:00.0").join("sriov_totalvfs"), "32\n");
        for (n, a, cur, creatable) in [
            (0, "0000:18:00.4", "1056", "ID    : vGPU Name\n"),
            (
                1,
                "0000:18:00.5",
                "0",
                "ID    : vGPU Name\n1056  : NVIDIA H100-4C\n",
            ),
        ] {
            ln(
                &format!("../{a}"),
                &dev("0000:18:00.0").join(format!("virtfn{n}")),
            );
            put(
                &dev(a).join("nvidia/current_vgpu_type"),
                &format!("{cur}\n"),
            );
            put(&dev(a).join("nvidia/creatable_vgpu_types"), creatable);
            ln(
                &format!("../../../kernel/iommu_groups/{}", 9 + n),
                &dev(a).join("iommu_group"),
            );
        }
        let t4 = dev("0000:2a:00.0");
        for (id, name, avail) in [(232, "NVIDIA T4-4Q", "3"), (233, "NVIDIA T4-8Q", "0")] {
            let d = t4.join(format!("mdev_supported_types/nvidia-{id}"));
            put(&d.join("name"), &format!("{name}\n"));
            put(&d.join("available_instances"), &format!("{avail}\n"));
            put(&d.join("create"), "");
        }
        let uuid = "3b1a5e2c-0000-4000-8000-000000000001";
        ln(
            "../mdev_supported_types/nvidia-232",
            &t4.join(uuid).join("mdev_type"),
        );
        ln(
            "../../../../kernel/iommu_groups/20",
            &t4.join(uuid).join("iommu_group"),
        );
        put(&t4.join(uuid).join("remove"), "");
        ln(
            &format!("../../../devices/pci0000:18/0000:2a:00.0/{uuid}"),
            &sys.join("bus/mdev/devices").join(uuid),
        );
        dir
    }

    #[test]
    fn scan_reads_vfs_their_types_mdev_types_and_instances() {
        let dir = tree();
        let host = VgpuHost::new(dir.path(), Arc::new(Recorder::default()));
        let facts = host.scan().unwrap();
        let want = VgpuHostFacts {
            gpus: vec![
                GpuVgpuHost {
                    address: "0000:18:00.0".into(),
                    total_vfs: 32,
                    vfs: vec![vf(0, 1056, &[]), vf(1, 0, &[1056])],
                    mdev_types: vec![],
                    instances: vec![VgpuInstance {
                        type_id: 1056,
                        vf_address: Some("0000:18:00.4".into()),
                        mdev_uuid: None,
                        iommu_group: Some("9".into()),
                    }],
                },
                GpuVgpuHost {
                    address: "0000:2a:00.0".into(),
                    total_vfs: 0,
                    vfs: vec![],
                    mdev_types: vec![
                        MdevType {
                            id: 232,
                            name: "NVIDIA T4-4Q".into(),
                            available: 3,
                        },
                        MdevType {
                            id: 233,
                            name: "NVIDIA T4-8Q".into(),
                            available: 0,
                        },
                    ],
                    instances: vec![VgpuInstance {
                        type_id: 232,
                        vf_address: None,
                        mdev_uuid: Some("3b1a5e2c-0000-4000-8000-000000000001".into()),
                        iommu_group: Some("20".into()),
                    }],
                },
            ],
        };
        assert_eq!(facts, want);
        assert!(
            VgpuHost::new("/nonexistent", Arc::new(Recorder::default()))
                .scan()
                .unwrap()
                .gpus
                .is_empty()
        );
    }

    #[test]
    fn writes_happen_only_when_something_changes_and_refusals_write_nothing() {
        let dir = tree();
        let kernel = Arc::new(Recorder::default());
        let host = VgpuHost::new(dir.path(), kernel.clone());
        let vf_type = |a: &str| {
            dir.path()
                .join(format!("sys/bus/pci/devices/{a}/nvidia/current_vgpu_type"))
        };
        // Already there, or already gone: nothing written.
        host.create_vdev("0000:18:00.4", 1056).unwrap();
        host.delete_vdev("0000:18:00.5").unwrap();
        // A VF that no longer exists (the VFs disabled since) holds no vGPU either.
        host.delete_vdev("0000:18:01.7").unwrap();
        host.remove_mdev("3b1a5e2c-0000-4000-8000-0000000000ff")
            .unwrap();
        host.create_mdev("0000:2a:00.0", 232, "3b1a5e2c-0000-4000-8000-000000000001")
            .unwrap();
        // Refused before any write.
        assert!(matches!(
            host.create_vdev("0000:18:00.4", 1058),
            Err(VgpuHostError::VfBusy { current: 1056, .. })
        ));
        let err = host.create_vdev("0000:18:00.5", 1058).unwrap_err();
        assert!(
            err.to_string()
                .contains("it runs 1 × H100-4C (0000:18:00.4)"),
            "{err}"
        );
        assert!(matches!(
            host.create_vdev("0000:18:00.0", 1056),
            Err(VgpuHostError::NoSuchVf { .. })
        ));
        assert!(matches!(
            host.create_mdev("0000:2a:00.0", 233, "3b1a5e2c-0000-4000-8000-000000000002"),
            Err(VgpuHostError::TypeNotCreatable { .. })
        ));
        assert!(matches!(
            host.create_mdev("0000:2a:00.0", 232, "not-a-uuid"),
            Err(VgpuHostError::BadUuid { .. })
        ));
        assert!(matches!(
            host.create_mdev("0000:2a:00.0", 233, "3b1a5e2c-0000-4000-8000-000000000001"),
            Err(VgpuHostError::UuidTaken {
                found_type: 232,
                ..
            })
        ));
        assert!(kernel.0.lock().unwrap().is_empty());
        assert_eq!(host.change_count(), 0);
        // A real change: one write, read back.
        host.create_vdev("0000:18:00.5", 1056).unwrap();
        host.delete_vdev("0000:18:00.4").unwrap();
        assert_eq!(
            *kernel.0.lock().unwrap(),
            vec![
                (vf_type("0000:18:00.5"), "1056".to_string()),
                (vf_type("0000:18:00.4"), "0".to_string()),
            ]
        );
        assert_eq!(host.change_count(), 2);
    }

    #[test]
    fn refresh_reads_again_only_the_gpus_written_to_or_refused_on() {
        let dir = tree();
        let host = VgpuHost::new(dir.path(), Arc::new(Recorder::default()));
        let mut facts = host.scan().unwrap();
        let dev = |a: &str| dir.path().join(format!("sys/bus/pci/devices/{a}"));
        // Behind the plugin's back, on the T4: not seen until a full scan.
        std::fs::write(
            dev("0000:2a:00.0").join("mdev_supported_types/nvidia-232/available_instances"),
            "1\n",
        )
        .unwrap();
        host.create_vdev("0000:18:00.5", 1056).unwrap();
        host.refresh(&mut facts).unwrap();
        let h100 = facts.gpu("0000:18:00.0").unwrap();
        assert_eq!(2, h100.instances.len(), "{h100:?}");
        assert_eq!(
            3,
            facts.gpu("0000:2a:00.0").unwrap().mdev_types[0].available
        );
        // Nothing marked: a refresh reads nothing.
        let before = facts.clone();
        host.refresh(&mut facts).unwrap();
        assert_eq!(before, facts);
        // A refusal marks its GPU: what the caller checked against was out of date.
        assert!(
            host.create_mdev("0000:2a:00.0", 233, "3b1a5e2c-0000-4000-8000-000000000009")
                .is_err()
        );
        host.refresh(&mut facts).unwrap();
        assert_eq!(
            1,
            facts.gpu("0000:2a:00.0").unwrap().mdev_types[0].available
        );
        assert_eq!(
            host.scan().unwrap(),
            facts,
            "refreshed as a full scan reads it"
        );
    }

    #[test]
    fn mdev_params_are_written_once_and_read_back() {
        let dir = tree();
        let kernel = Arc::new(Recorder::default());
        let host = VgpuHost::new(dir.path(), kernel.clone());
        let uuid = "3b1a5e2c-0000-4000-8000-000000000001";
        assert!(matches!(
            host.set_mdev_params(uuid, "disable_vnc=1"),
            Err(VgpuHostError::NoParamsFile { .. })
        ));
        let file = dir
            .path()
            .join("sys/bus/mdev/devices")
            .join(uuid)
            .join("nvidia/vgpu_params");
        put(&file, "\n");
        host.set_mdev_params(uuid, "disable_vnc=1").unwrap();
        host.set_mdev_params(uuid, "disable_vnc=1").unwrap();
        assert_eq!("disable_vnc=1", std::fs::read_to_string(&file).unwrap());
        assert_eq!(1, kernel.0.lock().unwrap().len(), "written once");
    }
}
