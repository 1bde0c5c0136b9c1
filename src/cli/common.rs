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

/// Runs a long-running verb on the two-thread runtime the node agents use.
///
/// Fails when the runtime cannot start ("starting the async runtime") or with the verb's error.
pub(crate) fn block_on<E>(
    work: impl std::future::Future<Output = Result<(), E>>,
) -> anyhow::Result<ExitCode>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(work)?;
    Ok(ExitCode::SUCCESS)
}
