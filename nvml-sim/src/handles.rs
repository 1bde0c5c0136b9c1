//! Opaque handles: what the library hands out as `nvmlDevice_t`, `nvmlGpuInstance_t`,
//! `nvmlComputeInstance_t`, `nvmlEventSet_t` and `nvmlGpmSample_t`.
//!
//! A handle is a tagged integer in pointer form, never dereferenced by anyone (NVML's handles
//! are opaque to callers too). Decoding checks the tag and the field ranges; the exported
//! functions then check that the GPU, instance or event set still exists. Nothing is
//! allocated per handle, so a handle cannot dangle: a stale one decodes and is refused.

/// What a handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handle {
    /// A physical GPU by index.
    Gpu(u32),
    /// A MIG device (a compute instance seen as a device).
    Mig {
        /// Parent GPU index.
        gpu: u32,
        /// GPU instance id.
        gi: u32,
        /// Compute instance id.
        ci: u32,
    },
    /// A GPU instance.
    GpuInstance {
        /// Parent GPU index.
        gpu: u32,
        /// GPU instance id.
        gi: u32,
    },
    /// A compute instance.
    ComputeInstance {
        /// Parent GPU index.
        gpu: u32,
        /// GPU instance id.
        gi: u32,
        /// Compute instance id.
        ci: u32,
    },
    /// An event set by id.
    EventSet(u32),
    /// A GPM sample by id.
    GpmSample(u32),
}

const TAG_SHIFT: u32 = 56;
const TAG_GPU: usize = 0x6e;
const TAG_MIG: usize = 0x6f;
const TAG_GI: usize = 0x70;
const TAG_CI: usize = 0x71;
const TAG_EVENT_SET: usize = 0x72;
const TAG_GPM_SAMPLE: usize = 0x73;

impl Handle {
    /// The integer form.
    pub fn encode(self) -> usize {
        let pack = |tag: usize, gpu: u32, gi: u32, ci: u32| {
            (tag << TAG_SHIFT) | ((gpu as usize) << 32) | ((gi as usize) << 16) | ci as usize
        };
        match self {
            Handle::Gpu(i) => pack(TAG_GPU, i, 0, 0),
            Handle::Mig { gpu, gi, ci } => pack(TAG_MIG, gpu, gi, ci),
            Handle::GpuInstance { gpu, gi } => pack(TAG_GI, gpu, gi, 0),
            Handle::ComputeInstance { gpu, gi, ci } => pack(TAG_CI, gpu, gi, ci),
            Handle::EventSet(id) => pack(TAG_EVENT_SET, 0, 0, 0) | id as usize,
            Handle::GpmSample(id) => pack(TAG_GPM_SAMPLE, 0, 0, 0) | id as usize,
        }
    }

    /// Decodes a handle; `None` for anything this library did not hand out.
    pub fn decode(raw: usize) -> Option<Handle> {
        let tag = raw >> TAG_SHIFT;
        let gpu = ((raw >> 32) & 0xff_ffff) as u32;
        let gi = ((raw >> 16) & 0xffff) as u32;
        let ci = (raw & 0xffff) as u32;
        match tag {
            TAG_GPU if gi == 0 && ci == 0 => Some(Handle::Gpu(gpu)),
            TAG_MIG => Some(Handle::Mig { gpu, gi, ci }),
            TAG_GI if ci == 0 => Some(Handle::GpuInstance { gpu, gi }),
            TAG_CI => Some(Handle::ComputeInstance { gpu, gi, ci }),
            TAG_EVENT_SET if gpu == 0 => Some(Handle::EventSet((raw & 0xffff_ffff) as u32)),
            TAG_GPM_SAMPLE if gpu == 0 => Some(Handle::GpmSample((raw & 0xffff_ffff) as u32)),
            _ => None,
        }
    }

    /// The handle as an opaque C pointer of type `*mut T`.
    pub fn to_ptr<T>(self) -> *mut T {
        std::ptr::without_provenance_mut(self.encode())
    }

    /// Decodes a C pointer.
    pub fn from_ptr<T>(ptr: *mut T) -> Option<Handle> {
        Handle::decode(ptr.addr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_handle_kind_round_trips_and_foreign_pointers_are_refused() {
        let all = [
            Handle::Gpu(0),
            Handle::Gpu(63),
            Handle::Mig {
                gpu: 3,
                gi: 13,
                ci: 0,
            },
            Handle::GpuInstance { gpu: 1, gi: 7 },
            Handle::ComputeInstance {
                gpu: 1,
                gi: 7,
                ci: 2,
            },
            Handle::EventSet(42),
            Handle::GpmSample(7),
        ];
        for h in all {
            assert_eq!(Handle::decode(h.encode()), Some(h));
            assert!(!h.to_ptr::<u8>().is_null());
        }
        assert_eq!(Handle::decode(0), None);
        assert_eq!(Handle::decode(0x7fff_1234_5678), None);
    }
}
