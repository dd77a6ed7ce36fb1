//! The short version of `bench/faults`: one run of a scenario drawn from the time (its seed is
//! printed, and `bench/faults --seed S` repeats it), with every check of the harness.

use baton_tests::nemesis::{self, Nemesis, Rng};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_struck_at_a_random_step_loses_and_doubles_nothing() -> anyhow::Result<()> {
    let _k = baton_tests::kafka_lock().await;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64;
    let mut rng = Rng::new(seed);
    let n = rng.pick(Nemesis::ALL);
    let s = rng.next_u64();
    eprintln!("{} with seed {s}", n.name());
    let o = nemesis::run(n, s).await?;
    eprintln!("{o:?}");
    assert_eq!(o.lost, 0, "{o:?}");
    assert_eq!(o.duplicated, 0, "{o:?}");
    assert!(o.two_writers.is_empty(), "{o:?}");
    assert!(o.passed(), "a transaction stayed open: {o:?}");
    Ok(())
}
