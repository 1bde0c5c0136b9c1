//! What the `prepare` bench shares to measure the plugin as the side-by-side harness of issue
//! 34 does: calls paced a fixed time apart (the harness waits 0.25 s between calls), the
//! latency of each, and the plugin process's CPU over the whole loop read from `/proc`, so
//! the background work each call causes (status writes, usage persistence, telemetry) and
//! the plugin's idle work in the meantime are in the figure, as they are in the harness's.

use std::time::{Duration, Instant};

/// Sorted samples' value at quantile `q` (nearest rank).
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The median of `samples` (sorted in place).
pub fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    percentile(samples, 0.5)
}

/// utime+stime of the whole process (every thread, ended ones included), in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let [utime, stime] = stat_fields(pid, [14, 15]);
    utime + stime
}

/// Minor page faults of the whole process so far (field 10 of `/proc/<pid>/stat`): each is
/// a page the kernel had to map (and zero) because the process touched memory it had given
/// back or never used.
pub fn minor_faults(pid: u32) -> u64 {
    let [minor] = stat_fields(pid, [10]);
    minor
}

/// Minor and major page faults of the whole process so far (fields 10 and 12 of
/// `/proc/<pid>/stat`), from one reading: a major fault is a page the kernel had to read from
/// its file (not found in the page cache).
pub fn page_faults(pid: u32) -> (u64, u64) {
    let [minor, major] = stat_fields(pid, [10, 12]);
    (minor, major)
}

/// Fields `numbers` (1-based, as proc(5) numbers them; from 3 on) of one reading of
/// `/proc/<pid>/stat`. Panics when the file cannot be read or a field is not a number.
fn stat_fields<const N: usize>(pid: u32, numbers: [usize; N]) -> [u64; N] {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Past the command name, which may hold spaces and parentheses: field 3 on.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..]
        .split_whitespace()
        .collect();
    numbers.map(|n| {
        fields[n - 3]
            .parse()
            .unwrap_or_else(|_| panic!("field {n} of /proc/{pid}/stat"))
    })
}

/// `getconf CLK_TCK`, 100 where it cannot be read.
pub fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// One live thread of the process, from its `schedstat` and `comm`.
#[derive(Clone)]
pub struct Thread {
    /// Its name (`main` for the main thread: threads started without a name carry the
    /// process's).
    pub name: String,
    /// CPU time so far, in nanoseconds (`schedstat`'s first field).
    pub ns: u64,
    /// Timeslices run so far (its third field: one per time the scheduler put the thread on
    /// a CPU, so a thread that sleeps and wakes adds one per wake).
    pub runs: u64,
}

/// The process's live threads by thread id (threads that ended are not seen).
pub fn threads(pid: u32) -> std::collections::BTreeMap<u64, Thread> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Default::default();
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| {
            let tid = t.file_name().to_str()?.parse::<u64>().ok()?;
            let stat = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            let mut fields = stat.split_whitespace().map(|f| f.parse::<u64>().ok());
            let (ns, runs) = (fields.next()??, fields.nth(1)??);
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            let name = match tid == u64::from(pid) {
                true => "main".to_string(),
                false => comm.trim().to_string(),
            };
            Some((tid, Thread { name, ns, runs }))
        })
        .collect()
}

/// CPU time of the process's live threads in nanoseconds (`schedstat`): precise, but blind
/// to threads that ended in between.
pub fn cpu_ns(pid: u32) -> u64 {
    threads(pid).values().map(|t| t.ns).sum()
}

/// The plugin's CPU between two readings: ticks of `/proc/<pid>/stat` (every thread, as the
/// harness reads it) and nanoseconds of the live threads' `schedstat`.
#[derive(Clone)]
pub struct CpuMark {
    pid: u32,
    ticks: u64,
    faults: u64,
    threads: std::collections::BTreeMap<u64, Thread>,
}

impl CpuMark {
    pub fn now(pid: u32) -> CpuMark {
        CpuMark {
            pid,
            ticks: cpu_ticks(pid),
            faults: minor_faults(pid),
            threads: threads(pid),
        }
    }

    /// Timeslices run since this mark, summed by thread name (threads born since count in
    /// full; threads that ended in between are not seen), largest first.
    pub fn slices_since(&self) -> Vec<(String, u64)> {
        let mut by_name = std::collections::BTreeMap::<String, u64>::new();
        for (tid, now) in threads(self.pid) {
            let before = self.threads.get(&tid).map_or(0, |t| t.runs);
            *by_name.entry(now.name).or_default() += now.runs.saturating_sub(before);
        }
        let mut v: Vec<(String, u64)> = by_name.into_iter().filter(|(_, n)| *n > 0).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }

    /// Minor page faults since this mark.
    pub fn faults_since(&self) -> u64 {
        minor_faults(self.pid).saturating_sub(self.faults)
    }

    /// CPU since this mark: `(from /proc/<pid>/stat, from the threads' schedstat)`.
    pub fn since(&self, hz: u64) -> (Duration, Duration) {
        let ticks = cpu_ticks(self.pid) - self.ticks;
        let stat = Duration::from_nanos(ticks * 1_000_000_000 / hz);
        let before: u64 = self.threads.values().map(|t| t.ns).sum();
        let sched = Duration::from_nanos(cpu_ns(self.pid).saturating_sub(before));
        (stat, sched)
    }
}

/// A paced loop's figures.
pub struct Paced {
    /// Each call's latency, in call order.
    pub samples: Vec<Duration>,
    /// Plugin CPU over the whole loop (from the first call to the end of the last pause),
    /// `/proc/<pid>/stat`.
    pub cpu_stat: Duration,
    /// The same from the threads' `schedstat`.
    pub cpu_sched: Duration,
    /// Minor page faults over the loop.
    pub faults: u64,
    /// Timeslices the plugin's threads ran over the loop, by thread name: how often each
    /// was woken (on a VM whose caches are cold after a pause, a wake-up costs 0.1–0.5 ms
    /// of CPU however little it does).
    pub slices: Vec<(String, u64)>,
    /// How long the loop took.
    pub wall: Duration,
}

impl Paced {
    /// The median call.
    pub fn p50(&self) -> Duration {
        median(&mut self.samples.clone())
    }

    /// The 99th percentile call.
    pub fn p99(&self) -> Duration {
        let mut sorted = self.samples.clone();
        sorted.sort();
        percentile(&sorted, 0.99)
    }
}

/// Runs `calls` calls of `call(i)`, `pause` apart (from the end of one to the start of the
/// next, as the harness sleeps between calls), timing each, and reads the plugin `pid`'s CPU
/// over the loop including the last pause, so background work the last call caused is in
/// it.
pub async fn paced(
    pid: u32,
    hz: u64,
    calls: usize,
    pause: Duration,
    mut call: impl AsyncFnMut(usize),
) -> Paced {
    let mark = CpuMark::now(pid);
    let started = Instant::now();
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls {
        let t = Instant::now();
        call(i).await;
        samples.push(t.elapsed());
        tokio::time::sleep(pause).await;
    }
    let (cpu_stat, cpu_sched) = mark.since(hz);
    Paced {
        samples,
        cpu_stat,
        cpu_sched,
        faults: mark.faults_since(),
        slices: mark.slices_since(),
        wall: started.elapsed(),
    }
}
