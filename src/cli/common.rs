//! What the verbs' runners share: writing to stdout, rendering an error on one line, and the
//! runtime of the long-running verbs.

use std::process::ExitCode;

use anyhow::Context;

/// `a: b: c` from an error and its sources, skipping causes already in the message.
pub(crate) fn chain(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
///
/// Fails on any other write error ("writing to stdout").
pub(crate) fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

/// How many threads run a long-running verb's async work.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Threads {
    /// One: the verb's own thread (a current-thread runtime), plus the blocking pool.
    ///
    /// The kubelet plugin runs so: its calls are serialised by the plugin lock anyway, and
    /// a second worker costs cross-thread wake-ups on every call and timer (a tenth of its
    /// CPU on the paced prepare loop of `cargo bench --bench prepare`, and a tenth of a
    /// millisecond of its p50). Synchronous work on that thread (a MIG carve, an MPS
    /// daemon's start) holds the other tasks meanwhile; the metrics and probe endpoint has
    /// its own thread for that reason.
    One,
    /// A multi-thread runtime of this many workers.
    Workers(usize),
}

/// How long an idle blocking thread of a long-running verb's runtime is kept.
const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(65);

/// Runs a long-running verb on a runtime of `threads`.
///
/// Fails when the runtime cannot start ("starting the async runtime") or with the verb's error.
pub(crate) fn block_on<E>(
    threads: Threads,
    work: impl std::future::Future<Output = Result<(), E>>,
) -> anyhow::Result<ExitCode>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let mut builder = match threads {
        Threads::One => tokio::runtime::Builder::new_current_thread(),
        Threads::Workers(workers) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(workers);
            builder
        }
    };
    // Blocking threads live past the longest regular interval (inventory, telemetry and
    // supervision every 10 s, holders every 30 s): tokio's default of 10 s retired each one
    // just before its next round, and a thread start (stack, TLS, page faults) every round
    // cost an idle plugin more CPU than the round's own work.
    let runtime = builder
        .enable_all()
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(work)?;
    Ok(ExitCode::SUCCESS)
}
