//! The simulated `nvidia-imex` and `nvidia-imex-ctl` as real processes on loopback addresses:
//! a domain forms over TCP and reaches quorum, a killed node shows in its peers' view, SIGUSR1
//! adds a node from the rewritten nodes config, SIGTERM exits cleanly, and a bad config fails
//! naming the key, the value and the valid choices.

mod imex_support;

use gpu_dra::compute_domain::imex::signal::{Signal, send};
use imex_support::*;

#[test]
fn three_daemons_reach_full_quorum_and_see_a_killed_peer() {
    let tmp = tempfile::tempdir().unwrap();
    let (imex, ctl_bin) = tools(tmp.path());
    let nodes = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];
    let configs: Vec<_> = nodes
        .iter()
        .map(|n| write_config(&tmp.path().join(n), n, "FULL", &nodes))
        .collect();
    let mut daemons: Vec<Daemon> = configs.iter().map(|c| start(&imex, c)).collect();
    for c in &configs {
        wait_for("READY on every node", || query(&ctl_bin, c) == "READY");
    }
    let (code, domain) = ctl(&ctl_bin, &["-c", configs[0].to_str().unwrap(), "-N"]);
    assert_eq!(code, 0);
    assert!(domain.contains("Domain State: UP"), "{domain}");
    for from in 0..3 {
        assert_eq!(row(&domain, from), ["C", "C", "C"], "{domain}");
    }
    assert!(
        domain.contains("Node #1   - 127.0.0.3       - READY"),
        "{domain}"
    );

    // SIGKILL node 2: its peers lose the connection (R) and stop being at full quorum.
    let mut killed = daemons.pop().unwrap();
    killed.0.kill().unwrap();
    killed.0.wait().unwrap();
    wait_for("peers to notice the lost node", || {
        query(&ctl_bin, &configs[0]) == "WAITING_FOR_PEERS"
    });
    let (_, domain) = ctl(&ctl_bin, &["-c", configs[0].to_str().unwrap(), "-N"]);
    assert_eq!(row(&domain, 0), ["C", "C", "R"], "{domain}");
    assert_eq!(row(&domain, 2), ["I", "I", "I"], "{domain}");
    assert!(domain.contains("127.0.0.4       - UNAVAILABLE"), "{domain}");
    assert!(domain.contains("Domain State: DEGRADED"), "{domain}");
    let (code, json) = ctl(&ctl_bin, &["-c", configs[1].to_str().unwrap(), "-N", "-j"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["status"], "DEGRADED");
    assert_eq!(
        v["nodes"][1]["connections"],
        serde_json::json!(["C", "C", "R"])
    );

    // The killed node's own command service is gone: UNAVAILABLE, exit 1.
    let (code, out) = ctl(&ctl_bin, &["-c", configs[2].to_str().unwrap(), "-q"]);
    assert_eq!((code, out.trim()), (1, "UNAVAILABLE"));
    drop(daemons);
}

#[test]
fn sigusr1_adds_a_node_from_the_rewritten_nodes_config_and_sigterm_exits_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let (imex, ctl_bin) = tools(tmp.path());
    let two = ["127.0.0.12", "127.0.0.13"];
    let three = ["127.0.0.12", "127.0.0.13", "127.0.0.14"];
    let dirs: Vec<_> = three.iter().map(|n| tmp.path().join(n)).collect();
    let configs = vec![
        write_config(&dirs[0], three[0], "FULL", &two),
        write_config(&dirs[1], three[1], "FULL", &two),
        write_config(&dirs[2], three[2], "FULL", &three),
    ];
    let mut daemons: Vec<Daemon> = configs.iter().map(|c| start(&imex, c)).collect();
    wait_for("the first two nodes ready", || {
        query(&ctl_bin, &configs[0]) == "READY" && query(&ctl_bin, &configs[1]) == "READY"
    });
    // The newcomer is not in their node map yet: refused, so it waits.
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(query(&ctl_bin, &configs[2]), "WAITING_FOR_PEERS");

    for (d, dir) in daemons.iter().zip(&dirs).take(2) {
        write_nodes(dir, &three);
        send(d.0.id(), Signal::User1).unwrap();
    }
    for c in &configs {
        wait_for("all three ready after the reload", || {
            query(&ctl_bin, c) == "READY"
        });
    }
    let (_, domain) = ctl(&ctl_bin, &["-c", configs[0].to_str().unwrap(), "-N"]);
    assert!(domain.contains("Domain State: UP"), "{domain}");
    let log = std::fs::read_to_string(dirs[0].join("imex.log")).unwrap();
    assert!(log.contains("SIGUSR1: 3 node(s)"), "{log}");

    let mut first = daemons.remove(0);
    send(first.0.id(), Signal::Terminate).unwrap();
    let status = first.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean shutdown");
}

/// Runs `nvidia-imex -c <config>` to its end: (exit code, stderr).
fn run_to_exit(imex: &std::path::Path, config: &std::path::Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(imex)
        .arg("-c")
        .arg(config)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_invalid_config_fails_naming_the_key_the_value_and_the_choices() {
    let tmp = tempfile::tempdir().unwrap();
    let (imex, ctl_bin) = tools(tmp.path());
    let config = write_config(tmp.path(), "127.0.0.22", "SOMETIMES", &["127.0.0.22"]);
    let (code, err) = run_to_exit(&imex, &config);
    assert_eq!(code, Some(1));
    assert!(
        err.contains(
            "IMEX_WAIT_FOR_QUORUM=\"SOMETIMES\" is invalid; valid: NONE, RECOVERY or FULL"
        ),
        "{err}"
    );
    write_config(
        tmp.path(),
        "127.0.0.22",
        "RECOVERY",
        &["127.0.0.22", "imex-node-1"],
    );
    let (code, err) = run_to_exit(&imex, &config);
    assert_eq!(code, Some(1));
    assert!(
        err.contains(":2: \"imex-node-1\" is not an IPv4 or IPv6 address"),
        "{err}"
    );
    let (code, _) = ctl(&ctl_bin, &["-s"]);
    assert_eq!(code, 2, "unsimulated ctl actions are refused");
}

#[test]
fn a_host_service_answers_nvidia_imex_ctl_dash_q_on_its_unix_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let (imex, ctl_bin) = tools(tmp.path());
    let (me, peer) = ("127.0.0.32", "127.0.0.33");
    let nodes = [me, peer];
    let socket = tmp.path().join("imex_ctrl.sock");
    let host_config = |dir: &std::path::Path, ip: &str| {
        let config = write_config(dir, ip, "FULL", &nodes);
        let mut text = std::fs::read_to_string(&config).unwrap();
        if ip == me {
            text.push_str(&format!("IMEX_CMD_UNIX_DOMAIN_PATH={}\n", socket.display()));
        }
        std::fs::write(&config, text).unwrap();
        config
    };
    let service = start(&imex, &host_config(&tmp.path().join(me), me));
    wait_for("the host socket", || socket.exists());
    let long = format!("--u={}", socket.display());
    let short = ["-u", socket.to_str().unwrap(), "-q"];
    // Full quorum with the peer absent: the service answers, but is not ready.
    assert_eq!(
        (ctl(&ctl_bin, &["-q", &long]), ctl(&ctl_bin, &short)),
        (
            (0, "WAITING_FOR_PEERS\n".to_string()),
            (0, "WAITING_FOR_PEERS\n".to_string())
        )
    );
    let _peer = start(&imex, &host_config(&tmp.path().join(peer), peer));
    wait_for("READY on the host socket", || {
        ctl(&ctl_bin, &["-q", &long]) == (0, "READY\n".to_string())
    });
    drop(service);
    assert_eq!(
        ctl(&ctl_bin, &["-q", &long]),
        (1, "UNAVAILABLE\n".to_string())
    );
}
