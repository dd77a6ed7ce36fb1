//! The short version of `bench/faults`: one run of a scenario drawn from the time (its seed is
//! printed, and `bench/faults --seed S` repeats it), with every check of the harness.

use baton_tests::nemesis::{self, Nemesis, Rng};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_struck_at_a_random_step_loses_and_doubles_nothing() -> anyhow::Result<()> {
    let _k = baton_tests::kafka_lock().await;
    let mut rng = Rng::new(seed_from_time()?);
    let n = rng.pick(Nemesis::ALL);
    // `BATON_TEST_NEMESIS=NAME` (a scenario's name in the table) runs that one.
    let n = match std::env::var("BATON_TEST_NEMESIS") {
        Ok(name) => *Nemesis::ALL
            .iter()
            .find(|n| n.name() == name)
            .ok_or_else(|| anyhow::anyhow!("no scenario named `{name}`"))?,
        Err(_) => n,
    };
    strike(n, rng.next_u64()).await
}

/// A split struck where it hurts most: its owner killed (-9) after the partition's final
/// commit, with the halves made and the split not yet recorded. The controller gives the split
/// up, the partition is failed over, nothing is lost or doubled, and no transaction stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_whose_owner_is_killed_midway_loses_and_doubles_nothing() -> anyhow::Result<()> {
    let _k = baton_tests::kafka_lock().await;
    strike(Nemesis::KillOwnerSplitting, seed_from_time()?).await
}

/// A merge struck where it hurts most: the host that merges (owner of both sides by then)
/// killed (-9) after both sides' final commits, with the merged partition caught up and the
/// merge not yet recorded. The merge is given up, the sides are failed over, nothing is lost or
/// doubled, and no transaction stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_whose_host_is_killed_midway_loses_and_doubles_nothing() -> anyhow::Result<()> {
    let _k = baton_tests::kafka_lock().await;
    strike(Nemesis::KillTargetMerging, seed_from_time()?).await
}

/// A seed from the clock (printed by [`strike`], so that a failure can be replayed).
fn seed_from_time() -> anyhow::Result<u64> {
    Ok(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64)
}

/// One run of scenario `n` with `seed`, and every check of the harness: nothing lost or
/// doubled, no two writers at one epoch, no transaction open past the session timeout plus 5 s.
async fn strike(n: Nemesis, seed: u64) -> anyhow::Result<()> {
    eprintln!("{} with seed {seed}", n.name());
    let o = nemesis::run(n, seed, 0).await?;
    eprintln!("{o:?}");
    assert_eq!((o.lost, o.duplicated), (0, 0), "{o:?}");
    assert!(o.two_writers.is_empty(), "{o:?}");
    assert!(o.passed(), "a transaction stayed open: {o:?}");
    Ok(())
}

/// The short version of `bench/faults --churn`: 12 moves 0.7 s apart over four partitions of
/// three hosts under load, one host killed halfway. Nothing lost or doubled, no two writers at
/// one epoch, and no move given up but for a host that left, restarted or did not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moves_under_churn_lose_and_double_nothing_and_give_up_only_for_a_host()
-> anyhow::Result<()> {
    let _k = baton_tests::kafka_lock().await;
    let seed = baton_tests::test_seed("churn");
    eprintln!("churn with seed {seed}");
    let c = nemesis::churn(12, seed, 0).await?;
    eprintln!("{c:?}");
    assert_eq!(c.lost, 0, "{c:?}");
    assert_eq!(c.duplicated, 0, "{c:?}");
    assert!(c.two_writers.is_empty(), "{c:?}");
    assert!(
        c.abandoned_otherwise.is_empty(),
        "moves given up for a race: {:?}",
        c.abandoned_otherwise
    );
    assert!(c.done > 0, "no move was done: {c:?}");
    Ok(())
}
