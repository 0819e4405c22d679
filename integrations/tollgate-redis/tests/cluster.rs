//! A local Redis Cluster of three masters, created by the test with `redis-cli --cluster
//! create`: keys spread over every master, decisions equal to one server's, and a slot
//! migrated mid-run (ASK while it moves, MOVED after) without losing a bucket's state.

mod common;

use std::time::Duration;

use common::{Cluster, Server};
use tollgate::{Rate, TokenBucket};
use tollgate_redis::RedisLimiter;

const T0: u64 = 1_780_000_000_000_000;

fn quota() -> TokenBucket {
    TokenBucket::new(Rate::per_second(10), 5).unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn on_cluster(cluster: &Cluster) -> RedisLimiter {
    RedisLimiter::builder(quota())
        .cluster(cluster.urls())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

#[test]
fn a_cluster_decides_as_one_server_and_follows_a_migrating_slot() {
    let cluster = Cluster::start();
    let single = Server::start(&[]);
    let rt = rt();
    rt.block_on(async {
        let c = on_cluster(&cluster).await;
        let s = RedisLimiter::builder(quota()).url(single.url()).connect().await.unwrap();

        // The same replayed schedule on 200 keys: equal decisions, keys on every master.
        for step in 0..6u64 {
            let at = T0 + step * 70_000;
            for k in 0..200 {
                let key = format!("user:{k}");
                let n = 1 + (k + step) % 3;
                let (a, b) = (
                    c.check_n_at_server_time(&key, n, at).await.unwrap(),
                    s.check_n_at_server_time(&key, n, at).await.unwrap(),
                );
                assert_eq!(a, b, "key {key} at step {step}");
            }
        }
        for node in &cluster.nodes {
            let keys: u64 = node.cli(&["DBSIZE"]).unwrap().trim().parse().unwrap();
            assert!(keys > 20, "a master holds only {keys} of 200 keys");
        }

        // Live, then migrate the key's slot from its master to another. A quota that refills
        // nothing while the test runs (5 per hour), so that every count below is exact.
        let c = RedisLimiter::builder(TokenBucket::new(Rate::per_hour(5), 5).unwrap())
            .cluster(cluster.urls())
            .prefix("mig:")
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let key = "moving";
        let full = format!("mig:{key}");
        for left in [4, 3] {
            assert_eq!(c.check(key).await.unwrap().remaining(), left);
        }
        let slot = cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", &full]).unwrap().trim().to_owned();
        let ids: Vec<String> =
            cluster.nodes.iter().map(|n| n.cli(&["CLUSTER", "MYID"]).unwrap().trim().to_owned()).collect();
        let owns = |n: &Server| n.cli(&["CLUSTER", "COUNTKEYSINSLOT", &slot]).unwrap().trim() != "0";
        let src = cluster.nodes.iter().position(owns).expect("the key's master");
        let dst = (src + 1) % 3;
        let (s_node, d_node) = (&cluster.nodes[src], &cluster.nodes[dst]);
        assert_eq!(d_node.cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &ids[src]]).unwrap().trim(), "OK");
        assert_eq!(s_node.cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &ids[dst]]).unwrap().trim(), "OK");
        assert_eq!(c.check(key).await.unwrap().remaining(), 2, "still on the source while migrating");
        let port = d_node.port.to_string();
        let moved = s_node.cli(&["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", &full]).unwrap();
        assert_eq!(moved.trim(), "OK");
        // The source now answers ASK for the key: the client asks the destination.
        assert_eq!(c.check(key).await.unwrap().remaining(), 1, "followed ASK to the destination");
        for node in &cluster.nodes {
            node.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &ids[dst]]).unwrap();
        }
        // The slot's owner changed: MOVED, and the client's slot map is refreshed.
        assert_eq!(c.check(key).await.unwrap().remaining(), 0, "followed MOVED, state intact");
        assert!(!c.check(key).await.unwrap().is_allowed_now());
        assert_eq!(d_node.cli(&["EXISTS", &full]).unwrap().trim(), "1");
        let st = c.stats();
        assert_eq!((st.failed_error, st.errors, st.timeouts), (0, 0, 0), "{st:?}");
    });
}
