//! `bench/faults`: the fault harness of reconfiguration (see `baton_tests::nemesis`), run
//! `--runs N` times (10 by default, one per scenario) over the scenarios in turn, with fault
//! times drawn from `--seed S` (printed; the current time by default). Prints each run, then a
//! table: scenario, runs, records, lost, duplicated, two writers, max pause, max open
//! transaction, pass. Exits non-zero when a check did not hold. `--churn N` instead asks for N
//! moves 0.7 s apart over four partitions of three hosts, one host killed halfway
//! (`baton_tests::nemesis::churn`), and prints how the moves ended and their pauses. `--keys K`
//! preloads K distinct keys before the faults or moves (production-shaped state: a target warms
//! them up, a take-over restores them); the checker asks word count for a sample of them and
//! checks uppercase's output of every one.

use baton_tests::nemesis::{self, Nemesis, Rng};

fn arg(name: &str) -> Option<u64> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let runs = arg("--runs").unwrap_or(Nemesis::ALL.len() as u64);
    let seed = arg("--seed").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let keys = arg("--keys").unwrap_or(0) as usize;
    if let Some(moves) = arg("--churn") {
        println!("churn: {moves} moves, seed {seed}, {keys} keys preloaded");
        let c = nemesis::churn(moves as usize, seed, keys).await?;
        let ms = |p: Option<f64>| p.map_or("-".into(), |p| format!("{p:.1}"));
        println!(
            "\n| moves asked | refused | done | abandoned for a host (left, restarted, did not drain) or a timeout | abandoned otherwise | pause p50 ms | pause p99 ms | pause max ms | records | lost | duplicated | two writers | pass |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.requested,
            c.refused.len(),
            c.done,
            c.abandoned_for_a_host.len(),
            c.abandoned_otherwise.len(),
            ms(c.pause(0.5)),
            ms(c.pause(0.99)),
            ms(c.pause(1.0)),
            c.records,
            c.lost,
            c.duplicated,
            c.two_writers.len(),
            if c.passed() { "yes" } else { "NO" }
        );
        for r in &c.refused {
            println!("refused: {r}");
        }
        for r in &c.slow {
            println!("slow: {r}");
        }
        for r in &c.abandoned_for_a_host {
            println!("abandoned for a host: {r}");
        }
        for r in &c.abandoned_otherwise {
            println!("abandoned otherwise: {r}");
        }
        if !c.passed() {
            std::process::exit(1);
        }
        return Ok(());
    }
    println!("faults: {runs} runs, seed {seed}, {keys} keys preloaded");
    let mut seeds = Rng::new(seed);
    let mut outcomes = Vec::new();
    let mut errors = 0;
    for r in 0..runs {
        let n = Nemesis::ALL[(r as usize) % Nemesis::ALL.len()];
        let s = seeds.next_u64();
        let started = std::time::Instant::now();
        match nemesis::run(n, s, keys).await {
            Ok(o) => {
                println!(
                    "run {r}: {} (seed {s}) in {:.0} s: {} records, lost {}, duplicated {}, two \
                     writers {:?}, open txn {:.1} s, max pause {:.0} ms, max move pause {} ms, {}; moves: {}",
                    n.name(),
                    started.elapsed().as_secs_f64(),
                    o.records,
                    o.lost,
                    o.duplicated,
                    o.two_writers,
                    o.open_txn.as_secs_f64(),
                    o.max_gap_ms,
                    o.max_pause_ms.map_or("-".into(), |p| format!("{p:.1}")),
                    if o.passed() { "pass" } else { "FAIL" },
                    o.moves.join("; ")
                );
                outcomes.push(o);
            }
            Err(e) => {
                errors += 1;
                println!("run {r}: {} (seed {s}): the run failed: {e:#}", n.name());
            }
        }
    }
    println!(
        "\nfaults (seed {seed}, {keys} keys preloaded)\n\n{}",
        nemesis::table(&outcomes)
    );
    if errors > 0 {
        println!("{errors} runs did not complete");
    }
    if errors > 0 || !outcomes.iter().all(|o| o.passed()) {
        std::process::exit(1);
    }
    Ok(())
}
