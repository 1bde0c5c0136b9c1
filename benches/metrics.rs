//! Cost of observability on the hot path and per scrape: recording one claim call (alone and
//! from two threads at once), counting an error kind, rendering /metrics, and one scrape over
//! TCP. Prints figures; asserts nothing. Run with `cargo bench --bench metrics`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use gpu_dra::metrics::{self, Health, Metrics, Operation, Outcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn report(what: &str, iterations: u32, elapsed: Duration) {
    let per = elapsed.as_secs_f64() * 1e9 / f64::from(iterations);
    println!("{what:<55} {per:>10.1} ns/op");
}

fn time<R>(what: &str, iterations: u32, mut f: impl FnMut(u32) -> R) {
    let start = Instant::now();
    for i in 0..iterations {
        black_box(f(i));
    }
    report(what, iterations, start.elapsed());
}

fn populated() -> Metrics {
    let m = Metrics::new();
    for i in 0..1000u64 {
        let outcome = if i % 10 == 0 {
            Outcome::Error
        } else {
            Outcome::Success
        };
        m.record_call(Operation::Prepare, outcome, Duration::from_micros(i * 37));
        m.record_call(Operation::Unprepare, outcome, Duration::from_micros(i * 11));
    }
    for kind in ["busy", "fetch", "hardware", "cdi", "unknown_device"] {
        m.record_error(kind);
    }
    m.set_published_devices(208);
    m
}

fn main() {
    println!("gpu-dra metrics");
    let m = Metrics::new();
    time("record_call (one thread)", 1_000_000, |i| {
        m.record_call(
            Operation::Prepare,
            Outcome::Success,
            Duration::from_micros(u64::from(i % 5000)),
        )
    });
    let contended = Metrics::new();
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..2 {
            let m = contended.clone();
            s.spawn(move || {
                for i in 0..500_000u64 {
                    m.record_call(
                        Operation::Prepare,
                        Outcome::Success,
                        Duration::from_micros(i % 5000),
                    );
                }
            });
        }
    });
    report(
        "record_call (two threads, per call)",
        1_000_000,
        start.elapsed(),
    );
    time("record_error", 1_000_000, |_| m.record_error("busy"));
    let full = populated();
    let text = full.render();
    time(&format!("render ({} bytes)", text.len()), 10_000, |_| {
        full.render()
    });

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let server = metrics::serve("127.0.0.1:0", full.clone(), Health::new())
            .await
            .expect("serve");
        let addr = server.local_addr();
        let iterations = 2_000;
        let start = Instant::now();
        for _ in 0..iterations {
            let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
                .await
                .expect("write");
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).await.expect("read");
            black_box(raw);
        }
        report(
            "GET /metrics over TCP (new connection each)",
            iterations,
            start.elapsed(),
        );
    });
}
