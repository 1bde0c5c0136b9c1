//! Cost of the per-claim file work on the prepare path: building a claim spec, writing it
//! atomically (renamed into place, not fsynced), and persisting a checkpoint update. Prints
//! figures; asserts nothing. Run with `cargo bench --bench cdi`.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use gpu_dra::cdi::{
    CdiWriter, ClaimDevice, ClaimNaming, GpuDeviceRef, HostMode, SimulatedHost, build_claim_spec,
};
use gpu_dra::checkpoint::{CheckpointStore, ClaimPhase, ClaimRecord, DeviceRecord};

const UID: &str = "3f2a9c1e-8b7d-4e21-a0c4-5d6e7f809a1b";

fn time<R>(what: &str, iterations: u32, mut f: impl FnMut(u32) -> R) {
    let start = Instant::now();
    for i in 0..iterations {
        black_box(f(i));
    }
    let per = start.elapsed() / iterations;
    println!("{what:<55} {:>10.1} µs/op", as_micros(per));
}

fn as_micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn devices(n: u32) -> Vec<ClaimDevice> {
    (0..n)
        .map(|i| ClaimDevice {
            device_name: format!("gpu-{i}"),
            share_id: None,
            gpu: GpuDeviceRef::Full {
                minor: i,
                uuid: format!("GPU-{i:08}"),
            },
            env: vec![],
            mounts: vec![],
        })
        .collect()
}

fn sim(n: u32) -> HostMode {
    let device_nodes = (0..n)
        .map(|i| {
            let node = SimulatedHost::char_node(&format!("/dev/nvidia{i}"), 195, i);
            (format!("GPU-{i:08}"), vec![node])
        })
        .collect::<BTreeMap<_, _>>();
    HostMode::Simulated(SimulatedHost {
        common_nodes: SimulatedHost::standard_control_nodes(510),
        device_nodes,
    })
}

fn record(uid: &str) -> ClaimRecord {
    ClaimRecord {
        uid: uid.to_string(),
        namespace: "ns".into(),
        name: "claim".into(),
        phase: ClaimPhase::PrepareCompleted,
        devices: vec![DeviceRecord {
            request_names: vec!["gpu".into()],
            pool: "node".into(),
            device: "gpu-0".into(),
            share_id: None,
            cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={uid}-gpu-0")],
            gpu_uuid: "GPU-0".into(),
            mig: None,
            sharing: None,
            vfio: None,
            vgpu: None,
        }],
        updated_unix: 0,
        fabric_partition: None,
    }
}

fn main() {
    let naming = ClaimNaming::default();
    for n in [1, 8] {
        let mode = sim(n);
        let devs = devices(n);
        let gpus: Vec<GpuDeviceRef> = devs.iter().map(|d| d.gpu.clone()).collect();
        time(
            &format!("facts + build spec, simulated, {n} device(s)"),
            2000,
            |_| {
                let facts = mode.facts(&gpus).unwrap();
                build_claim_spec(&naming, UID, &devs, &facts).unwrap()
            },
        );
    }

    let tmp = tempfile::tempdir().unwrap();
    let writer = CdiWriter::new(tmp.path().join("cdi"));
    let mode = sim(8);
    let devs = devices(8);
    let gpus: Vec<GpuDeviceRef> = devs.iter().map(|d| d.gpu.clone()).collect();
    let spec = build_claim_spec(&naming, UID, &devs, &mode.facts(&gpus).unwrap()).unwrap();
    time("write claim spec atomically, 8 devices", 200, |_| {
        writer.write_claim_spec(UID, &spec).unwrap()
    });

    for claims in [10, 200] {
        let dir = tmp.path().join(format!("state-{claims}"));
        let (mut store, _) = CheckpointStore::open(&dir, "boot").unwrap();
        store
            .update(|cp| {
                for i in 0..claims {
                    let uid = format!("claim-{i}");
                    cp.claims.insert(uid.clone(), record(&uid));
                }
            })
            .unwrap();
        time(
            &format!("checkpoint update, {claims} claims stored"),
            200,
            |i| {
                store
                    .update(|cp| cp.claims.get_mut("claim-0").unwrap().updated_unix = i.into())
                    .unwrap()
            },
        );
        time(
            &format!("checkpoint open + verify, {claims} claims stored"),
            200,
            |_| CheckpointStore::open(&dir, "boot").unwrap(),
        );
    }
}
