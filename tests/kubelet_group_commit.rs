//! Group commit over real sockets: kubelet calls that arrive while another holds the plugin
//! lock are served together as one handler call, each kubelet call gets exactly its own
//! claims' answers, and a prepare's claims are read ahead (`prefetch`) before the call waits
//! for the lock.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_dra::kubelet::client::{DraApi, KubeletClient, KubeletVersions};
use gpu_dra::kubelet::{
    ClaimRef, DraHandler, PluginSockets, PrepareResults, PreparedDevice, UnprepareResults, serve,
};
use tokio::sync::Semaphore;

fn claim(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "team".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
    }
}

fn device(uid: &str) -> PreparedDevice {
    PreparedDevice {
        device_name: format!("dev-{uid}"),
        ..PreparedDevice::default()
    }
}

/// Records what it is asked; its prepares wait for a permit the test hands out.
struct Gate {
    prefetched: Mutex<Vec<Vec<String>>>,
    prepared: Mutex<Vec<Vec<String>>>,
    permits: Semaphore,
}

fn uids(claims: &[ClaimRef]) -> Vec<String> {
    claims.iter().map(|c| c.uid.clone()).collect()
}

impl DraHandler for Gate {
    async fn prefetch(&self, claims: &[ClaimRef]) {
        self.prefetched.lock().unwrap().push(uids(claims));
    }

    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        self.prepared.lock().unwrap().push(uids(&claims));
        self.permits.acquire().await.unwrap().forget();
        claims
            .iter()
            .map(|c| (c.uid.clone(), Ok(vec![device(&c.uid)])))
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        claims.iter().map(|c| (c.uid.clone(), Ok(()))).collect()
    }
}

fn sockets(dir: &Path) -> PluginSockets {
    PluginSockets {
        driver_name: "gpu.nvidia.com".into(),
        registry_dir: dir.join("registry"),
        plugin_dir: dir.join("plugins").join("gpu.nvidia.com"),
        pod_uid: None,
    }
}

async fn until(what: &str, mut ready: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if ready() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_arrive_while_one_holds_the_lock_are_served_as_one_batch_with_their_own_answers()
{
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate {
        prefetched: Mutex::default(),
        prepared: Mutex::default(),
        permits: Semaphore::new(0),
    });
    let plugin = serve(sockets(dir.path()), Arc::clone(&gate), None)
        .await
        .unwrap();
    let versions = KubeletVersions {
        dra: vec![DraApi::V1],
        health: vec![],
    };
    let mut kubelets = Vec::new();
    for _ in 0..4 {
        let kubelet = KubeletClient::register(plugin.registration_socket(), &versions)
            .await
            .unwrap();
        kubelets.push(kubelet);
    }
    let calls: Vec<Vec<ClaimRef>> = vec![
        vec![claim("first")],
        vec![claim("a"), claim("shared")],
        vec![claim("b")],
        vec![claim("shared"), claim("c")],
    ];

    let mut tasks = Vec::new();
    for (i, (mut kubelet, claims)) in kubelets.into_iter().zip(calls.clone()).enumerate() {
        tasks.push(tokio::spawn(async move {
            kubelet.prepare(&claims).await.unwrap()
        }));
        if i == 0 {
            // The first call holds the lock, waiting in the handler.
            until("the first call in the handler", || {
                gate.prepared.lock().unwrap().len() == 1
            })
            .await;
        }
    }
    // Every call read its claims ahead, then queued behind the first.
    until("every call read ahead", || {
        gate.prefetched.lock().unwrap().len() == 4
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    gate.permits.add_permits(2);

    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    for (claims, answer) in calls.iter().zip(&answers) {
        let want: PrepareResults = claims
            .iter()
            .map(|c| (c.uid.clone(), Ok(vec![device(&c.uid)])))
            .collect();
        assert_eq!(*answer, want, "each call gets its own claims' answers");
    }
    let batches = gate.prepared.lock().unwrap().clone();
    assert_eq!(batches.len(), 2, "{batches:?}");
    assert_eq!(batches[0], ["first"]);
    let mut second = batches[1].clone();
    second.sort();
    assert_eq!(
        second,
        ["a", "b", "c", "shared"],
        "each UID once in the batch"
    );
}
