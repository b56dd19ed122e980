//! The etcd discovery backend against a real etcd server on loopback.

use std::time::{Duration, Instant};

use clockmesh::discovery::{
    Discovery, DiscoveryError, Member, Membership,
    etcd::{EtcdConfig, EtcdDiscovery},
};
use clockmesh_core::graph::ProbeGraph;
use clockmesh_testbed::etcd::EtcdServer;

fn member(name: &str, last_octet: u8) -> Member {
    Member {
        name: name.into(),
        id: 0,
        addr: [198, 18, 0, last_octet].into(),
        probe_port: 31_900,
        capabilities: 0,
    }
}

async fn connect(server: &EtcdServer) -> EtcdDiscovery {
    EtcdDiscovery::connect(EtcdConfig {
        endpoints: vec![server.endpoint.clone()],
        cluster: "test".into(),
        member_ttl_s: 2,
        campaign_ttl_s: 2,
    })
    .await
    .expect("connect")
}

/// `n` members `node-0`, `node-1`, … registered in that order, each on its
/// own connections.
async fn registered(server: &EtcdServer, n: u8) -> Vec<(Member, EtcdDiscovery)> {
    let mut nodes = Vec::new();
    for i in 0..n {
        let mut d = connect(server).await;
        let m = d
            .register(&member(&format!("node-{i}"), i + 1))
            .await
            .unwrap();
        nodes.push((m, d));
    }
    nodes
}

/// The names on `d`'s member list.
async fn listed_names(d: &mut EtcdDiscovery) -> Vec<String> {
    d.members()
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect()
}

/// Polls `cond` (an expression that may `.await`) for up to 15 s.
macro_rules! wait_for {
    ($what:expr, $cond:expr) => {{
        let deadline = Instant::now() + Duration::from_secs(15);
        while !$cond {
            assert!(Instant::now() < deadline, "timed out waiting for {}", $what);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }};
}

#[tokio::test]
async fn members_register_elect_one_leader_and_fail_over() {
    let server = EtcdServer::start().expect("etcd");
    let (mut a, mut b, mut c) = (
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    );
    let ra = a.register(&member("node-a", 1)).await.unwrap();
    let rb = b.register(&member("node-b", 2)).await.unwrap();
    let rc = c.register(&member("node-c", 3)).await.unwrap();
    assert!(
        ra.id != rb.id && rb.id != rc.id && ra.id != rc.id,
        "unique ids"
    );

    let listed = a.members().await.unwrap();
    let names: Vec<_> = listed.iter().map(|m| (m.name.as_str(), m.id)).collect();
    assert_eq!(
        names,
        [("node-a", ra.id), ("node-b", rb.id), ("node-c", rc.id)]
    );

    wait_for!("a leader", b.leadership().await.unwrap().leader.is_some());
    let views = [
        a.leadership().await.unwrap(),
        b.leadership().await.unwrap(),
        c.leadership().await.unwrap(),
    ];
    let leader = views[0].leader.clone().unwrap();
    assert!(
        views
            .iter()
            .all(|v| v.leader.as_deref() == Some(leader.as_str())),
        "{views:?}"
    );
    assert_eq!(views.iter().filter(|v| v.is_me).count(), 1);

    // The leader leaves cleanly: another is elected and it is off the list.
    let (leaving, stay1, stay2) = match leader.as_str() {
        "node-a" => (&mut a, &mut b, &mut c),
        "node-b" => (&mut b, &mut a, &mut c),
        _ => (&mut c, &mut a, &mut b),
    };
    leaving.leave().await.unwrap();
    wait_for!(
        "a new leader",
        stay1
            .leadership()
            .await
            .unwrap()
            .leader
            .is_some_and(|l| l != leader)
    );
    // The list follows a watch: the departure arrives within milliseconds.
    wait_for!(
        "the leader off the list",
        stay2.members().await.unwrap().len() == 2
    );
    assert!(!listed_names(stay2).await.contains(&leader));
}

#[tokio::test]
async fn a_crashed_member_disappears_when_its_lease_expires_and_rejoins_under_its_id() {
    let server = EtcdServer::start().expect("etcd");
    let mut a = connect(&server).await;
    let mut b = connect(&server).await;
    a.register(&member("node-a", 1)).await.unwrap();
    let first = b.register(&member("node-b", 2)).await.unwrap();
    drop(b); // a crash: no leave, the keep-alive stops
    wait_for!("node-b to lapse", a.members().await.unwrap().len() == 1);
    let mut b = connect(&server).await;
    let again = b.register(&member("node-b", 2)).await.unwrap();
    assert_eq!(first.id, again.id, "a restarted agent keeps its id");
    // a's list follows a watch: the join arrives within milliseconds.
    wait_for!("node-b back", a.members().await.unwrap().len() == 2);
    let members = a.members().await.unwrap();
    assert!(
        members
            .iter()
            .any(|m| m.name == "node-b" && m.id == first.id)
    );
    // Another name never gets it.
    let mut c = connect(&server).await;
    let other = c.register(&member("node-c", 3)).await.unwrap();
    assert_ne!(other.id, first.id);
}

/// A seat holder's candidacy is bound to a short campaign lease of its own,
/// apart from its member lease: a crashed leader (no leave) leaves the
/// election within the campaign lease's TTL while the long member lease
/// still lists it, so that failover does not wait for the member TTL that
/// every member keeps alive.
#[tokio::test]
async fn a_crashed_leader_leaves_the_election_on_its_campaign_lease_before_the_list() {
    let server = EtcdServer::start().expect("etcd");
    let long_member_lease = |server: &EtcdServer| {
        EtcdDiscovery::connect(EtcdConfig {
            endpoints: vec![server.endpoint.clone()],
            cluster: "test".into(),
            member_ttl_s: 60,
            campaign_ttl_s: 2,
        })
    };
    let mut a = long_member_lease(&server).await.expect("connect");
    let mut b = long_member_lease(&server).await.expect("connect");
    a.register(&member("node-a", 1)).await.unwrap();
    b.register(&member("node-b", 2)).await.unwrap();
    wait_for!("a leader", a.leadership().await.unwrap().leader.is_some());
    let leader = a.leadership().await.unwrap().leader.unwrap();
    let (crashed, survivor) = if leader == "node-a" {
        (a, &mut b)
    } else {
        (b, &mut a)
    };
    wait_for!(
        "both to see the leader",
        survivor.leadership().await.unwrap().leader.as_deref() == Some(leader.as_str())
    );
    let crashed_at = Instant::now();
    drop(crashed); // no leave: both keep-alives stop
    wait_for!(
        "the survivor to lead",
        survivor.leadership().await.unwrap().is_me
    );
    let took = crashed_at.elapsed();
    // The campaign lease's 2 s and etcd's lease check, far short of 60 s.
    assert!(took < Duration::from_secs(10), "failover took {took:?}");
    let names = listed_names(survivor).await;
    assert!(
        names.contains(&leader),
        "the crashed leader's member lease (60 s) still lists it: {names:?}"
    );
}

/// etcd's count of served `method` requests, from its `/metrics`.
fn served(server: &EtcdServer, method: &str) -> u64 {
    use std::io::{Read, Write};
    let addr = server.endpoint.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("etcd metrics");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{"))
        .filter(|l| l.contains(&format!("grpc_method=\"{method}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The member list and the election are read whole once, then follow
/// watches: refreshing them costs etcd no read (at N members, a read of
/// the member prefix per refresh per agent was O(N²) across the cluster),
/// and joins and departures, lease lapses included, still arrive.
#[tokio::test]
async fn the_member_list_and_the_leader_follow_watches_instead_of_reads() {
    let server = EtcdServer::start().expect("etcd");
    let mut a = connect(&server).await;
    a.register(&member("node-a", 1)).await.unwrap();
    assert_eq!(a.members().await.unwrap().len(), 1);
    wait_for!(
        "node-a to lead",
        a.leadership().await.unwrap().leader.as_deref() == Some("node-a")
    );
    let ranges = served(&server, "Range");
    assert!(ranges > 0, "etcd counts the first reads");
    for _ in 0..20 {
        a.members().await.unwrap();
        assert!(a.leadership().await.unwrap().is_me);
    }
    assert_eq!(served(&server, "Range"), ranges, "refreshes read nothing");
    let mut b = connect(&server).await;
    b.register(&member("node-b", 2)).await.unwrap();
    wait_for!("node-b to join", a.members().await.unwrap().len() == 2);
    drop(b); // a crash: its lease lapses and etcd deletes its record
    wait_for!("node-b to lapse", a.members().await.unwrap().len() == 1);
    assert_eq!(a.members().await.unwrap()[0].name, "node-a");
}

/// Base64, as etcd's JSON gateway takes keys.
fn b64(s: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in s.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            let pad = i > c.len();
            out.push(if pad {
                '='
            } else {
                A[(n >> (18 - 6 * i) & 63) as usize] as char
            });
        }
    }
    out
}

/// A request to etcd's JSON gateway at `path`, its answer.
fn gateway(server: &EtcdServer, path: &str, body: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let addr = server.endpoint.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("etcd gateway");
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let json = &text[text.find("\r\n\r\n").map_or(0, |i| i + 4)..];
    serde_json::from_str(json).expect(json)
}

/// How many keys etcd holds under `prefix` (count only).
fn keys_under(server: &EtcdServer, prefix: &str) -> u64 {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    let body = format!(
        r#"{{"key":"{}","range_end":"{}","count_only":true}}"#,
        b64(prefix.as_bytes()),
        b64(&end)
    );
    let v = gateway(server, "/v3/kv/range", &body);
    v["count"].as_str().map_or(0, |c| c.parse().unwrap())
}

/// Deletes one key, as an operator (or a lapsed lease) would.
fn delete_key(server: &EtcdServer, key: &str) {
    let body = format!(r#"{{"key":"{}"}}"#, b64(key.as_bytes()));
    gateway(server, "/v3/kv/deleterange", &body);
}

/// Only three members stand for leader (the first to take the seats): the
/// election holds three keys however many members there are, and a
/// departed candidate's seat goes to the next member that looks.
#[tokio::test]
async fn only_three_members_stand_for_leader() {
    let server = EtcdServer::start().expect("etcd");
    let mut nodes: Vec<(String, EtcdDiscovery)> = registered(&server, 6)
        .await
        .into_iter()
        .map(|(m, d)| (m.name, d))
        .collect();
    // Only seat holders follow the election (the others learn the leader
    // from the place it hands them): the leader any of them names.
    let mut leader = None;
    for _ in 0..150 {
        for (_, d) in nodes.iter_mut() {
            leader = d.leadership().await.unwrap().leader.or(leader);
        }
        if leader.is_some() && keys_under(&server, "/clockmesh/test/leader/") == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        keys_under(&server, "/clockmesh/test/leader/"),
        3,
        "three candidates"
    );
    let first: Vec<String> = (0..3).map(|i| format!("node-{i}")).collect();
    // The first three to look took the seats.
    assert!(first.contains(&leader.clone().unwrap()), "{leader:?}");
    // The leader leaves: another takes over, and a fourth member stands
    // in its seat.
    let at = nodes
        .iter()
        .position(|(name, _)| Some(name) == leader.as_ref())
        .unwrap();
    let (_, mut gone) = nodes.remove(at);
    gone.leave().await.unwrap();
    wait_for!("a new leader and three candidates again", {
        let mut now = None;
        for (_, d) in nodes.iter_mut() {
            d.members().await.unwrap();
            now = d.leadership().await.unwrap().leader.or(now);
        }
        now.is_some() && now != leader && keys_under(&server, "/clockmesh/test/leader/") == 3
    });
}

/// Members without a seat read only their own place, handed out by the
/// leader: the same edges the whole graph gives them, the leader's record,
/// and an error once the leader no longer lists them (their lease lapsed),
/// after which they register again and get a place again.
#[tokio::test]
async fn members_without_a_seat_follow_the_place_the_leader_hands_out() {
    let server = EtcdServer::start().expect("etcd");
    let mut nodes = registered(&server, 7).await;
    // Every member refreshes as the driver does; the seat holders get the
    // whole list, and one of them leads.
    let mut seated = Vec::new();
    for (m, d) in nodes.iter_mut() {
        if matches!(d.membership().await.unwrap(), Membership::All(_)) {
            seated.push(m.name.clone());
        }
        d.leadership().await.unwrap();
    }
    assert_eq!(seated, ["node-0", "node-1", "node-2"]);
    let leader = {
        let (_, d) = &mut nodes[0];
        wait_for!("a leader", d.leadership().await.unwrap().leader.is_some());
        d.leadership().await.unwrap().leader.unwrap()
    };
    let at = nodes.iter().position(|(m, _)| m.name == leader).unwrap();
    let graph = hand_out(&mut nodes[at].1).await;
    for (m, d) in nodes.iter_mut().skip(3) {
        wait_for!(
            "its place",
            matches!(d.membership().await, Ok(Membership::Place(_)))
        );
        let Ok(Membership::Place(place)) = d.membership().await else {
            panic!("no place");
        };
        assert_eq!(place.edges, graph.neighbourhood(m.id), "{}", m.name);
        assert_eq!(place.total, 7);
        assert!(place.members.iter().any(|p| p.name == leader));
        let named = d.leadership().await.unwrap();
        assert_eq!(
            named.leader.as_deref(),
            Some(leader.as_str()),
            "from its place"
        );
        assert!(!named.is_me);
        assert!(place.members.len() < 7, "not the whole list");
    }
    // node-6's record vanishes (as when its lease lapses): the leader
    // takes its place back, and node-6 hears it is no longer listed.
    delete_key(&server, "/clockmesh/test/members/node-6");
    wait_for!(
        "the leader to see it gone",
        nodes[at].1.members().await.unwrap().len() == 6
    );
    hand_out(&mut nodes[at].1).await;
    let (six, d6) = &mut nodes[6];
    wait_for!("node-6 told", d6.membership().await.is_err());
    let gone = d6.membership().await.err();
    assert!(
        matches!(gone, Some(DiscoveryError::NotAMember(ref n)) if n == "node-6"),
        "{gone:?}"
    );
    let again = d6.register(six).await.unwrap();
    assert_eq!(again.id, six.id);
    assert_eq!(d6.membership().await.unwrap(), Membership::Pending);
    wait_for!(
        "the leader to list it again",
        nodes[at].1.members().await.unwrap().len() == 7
    );
    hand_out(&mut nodes[at].1).await;
    wait_for!(
        "node-6's place again",
        matches!(nodes[6].1.membership().await, Ok(Membership::Place(_)))
    );
}

/// The driver's part as leader: the whole list, its graph, the places
/// handed out.
async fn hand_out(leader: &mut EtcdDiscovery) -> ProbeGraph {
    wait_for!(
        "the leader elected",
        leader.leadership().await.unwrap().is_me
    );
    let all = leader.members().await.unwrap();
    let ids: Vec<u32> = all.iter().map(|m| m.id).collect();
    let graph = ProbeGraph::build(&ids, 2);
    leader.hand_out(&graph, &all).await.unwrap();
    graph
}

#[tokio::test]
async fn unreachable_etcd_is_a_clear_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = EtcdDiscovery::connect(EtcdConfig {
        endpoints: vec![format!("127.0.0.1:{port}")],
        cluster: "test".into(),
        member_ttl_s: 2,
        campaign_ttl_s: 2,
    })
    .await
    .err()
    .expect("no etcd there");
    assert!(
        err.to_string().contains("coordination engine unavailable"),
        "{err}"
    );
}
