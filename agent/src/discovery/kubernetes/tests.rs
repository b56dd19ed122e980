//! The Kubernetes backend against an in-memory API server: a
//! `tower::service_fn` behind `kube::Client::new` that answers the requests
//! kube-rs makes (pod list, chunked pod watch, pod merge patch, Lease get,
//! create and replace with resourceVersion conflicts) from recorded-style
//! JSON objects, and can be taken down to play an unreachable API server.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::UnsyncBoxBody};
use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{Pod, PodCondition, PodSpec, PodStatus},
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use kube::{Client, client::Body};
use serde_json::json;

use super::*;

const NS: &str = "clockmesh";
const SELECTOR: &str = "app.kubernetes.io/name=clockmesh";
const LEASE: &str = "clockmesh-leader";
/// Port assumed for pods without the probe-address annotation.
const FALLBACK_PORT: u16 = 31950;

type RespBody = UnsyncBoxBody<Bytes, Infallible>;
type Frames = mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>;

#[derive(Default)]
struct ApiState {
    pods: BTreeMap<String, Pod>,
    lease: Option<Lease>,
    rv: u64,
    /// Pod watch events (resourceVersion, JSON line), replayed to a watch
    /// that starts from an older resourceVersion.
    events: Vec<(u64, Pod, String)>,
    watchers: Vec<(String, Frames)>,
    down: bool,
    log: Vec<String>,
}

#[derive(Clone, Default)]
struct FakeApi(Arc<Mutex<ApiState>>);

fn status(code: StatusCode, reason: &str, message: &str) -> Response<RespBody> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    json_response(code, &body)
}

fn json_response(code: StatusCode, body: &impl serde::Serialize) -> Response<RespBody> {
    let bytes = Bytes::from(serde_json::to_vec(body).unwrap());
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(bytes).boxed_unsync())
        .unwrap()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

fn query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), percent_decode(v)))
        .collect()
}

/// Equality-based selectors only (`k=v,k2=v2`), all the backend uses.
fn selects(selector: &str, pod: &Pod) -> bool {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    selector
        .split(',')
        .filter(|s| !s.is_empty())
        .all(|term| match term.split_once('=') {
            Some((k, v)) => labels.get(k).map(String::as_str) == Some(v),
            None => false,
        })
}

impl FakeApi {
    fn state(&self) -> std::sync::MutexGuard<'_, ApiState> {
        self.0.lock().unwrap()
    }

    fn client(&self) -> Client {
        let api = self.clone();
        let service = tower::service_fn(move |req: Request<Body>| {
            let api = api.clone();
            async move { api.handle(req).await }
        });
        Client::new(service, NS)
    }

    #[expect(
        clippy::too_many_lines,
        reason = "the fake API server: one match arm per request the backend makes"
    )]
    async fn handle(&self, req: Request<Body>) -> Result<Response<RespBody>, std::io::Error> {
        let (parts, body) = req.into_parts();
        let body = body.collect_bytes().await.unwrap_or_default();
        let path = parts.uri.path().to_owned();
        let q = query(parts.uri.query().unwrap_or(""));
        let mut st = self.state();
        st.log.push(format!(
            "{} {}?{}",
            parts.method,
            path,
            parts.uri.query().unwrap_or("")
        ));
        if st.down {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused (test: API server down)",
            ));
        }
        let seg: Vec<&str> = path.trim_matches('/').split('/').collect();
        let m = &parts.method;
        Ok(match seg.as_slice() {
            ["api", "v1", "namespaces", NS, "pods"] if *m == Method::GET => {
                let selector = q.get("labelSelector").cloned().unwrap_or_default();
                if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
                    let from: u64 = q
                        .get("resourceVersion")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    let (tx, rx) = mpsc::unbounded();
                    for (rv, pod, line) in &st.events {
                        if *rv > from && selects(&selector, pod) {
                            let _ = tx.unbounded_send(Ok(Frame::data(Bytes::from(line.clone()))));
                        }
                    }
                    st.watchers.push((selector, tx));
                    Response::builder()
                        .status(StatusCode::OK)
                        .header("content-type", "application/json")
                        .body(StreamBody::new(rx).boxed_unsync())
                        .unwrap()
                } else {
                    let items: Vec<&Pod> =
                        st.pods.values().filter(|p| selects(&selector, p)).collect();
                    json_response(
                        StatusCode::OK,
                        &json!({
                            "apiVersion": "v1", "kind": "PodList",
                            "metadata": {"resourceVersion": st.rv.to_string()},
                            "items": items,
                        }),
                    )
                }
            }
            ["api", "v1", "namespaces", NS, "pods", name] if *m == Method::PATCH => {
                let Some(mut pod) = st.pods.get(*name).cloned() else {
                    return Ok(status(StatusCode::NOT_FOUND, "NotFound", "pod not found"));
                };
                let patch: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let annotations = pod.metadata.annotations.get_or_insert_default();
                for (k, v) in patch["metadata"]["annotations"].as_object().unwrap() {
                    annotations.insert(k.clone(), v.as_str().unwrap().to_owned());
                }
                drop(st);
                let pod = self.put_pod(pod);
                json_response(StatusCode::OK, &pod)
            }
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                NS,
                "leases",
            ] if *m == Method::POST => {
                if st.lease.is_some() {
                    return Ok(status(
                        StatusCode::CONFLICT,
                        "AlreadyExists",
                        "lease exists",
                    ));
                }
                let mut lease: Lease = serde_json::from_slice(&body).unwrap();
                st.rv += 1;
                lease.metadata.resource_version = Some(st.rv.to_string());
                st.lease = Some(lease.clone());
                json_response(StatusCode::CREATED, &lease)
            }
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                NS,
                "leases",
                LEASE,
            ] => match st.lease.clone() {
                Some(lease) if *m == Method::GET => json_response(StatusCode::OK, &lease),
                Some(current) if *m == Method::PUT => {
                    let mut lease: Lease = serde_json::from_slice(&body).unwrap();
                    if lease.metadata.resource_version != current.metadata.resource_version {
                        return Ok(status(StatusCode::CONFLICT, "Conflict", "stale rv"));
                    }
                    st.rv += 1;
                    lease.metadata.resource_version = Some(st.rv.to_string());
                    st.lease = Some(lease.clone());
                    json_response(StatusCode::OK, &lease)
                }
                _ => status(StatusCode::NOT_FOUND, "NotFound", "no lease"),
            },
            _ => status(StatusCode::NOT_FOUND, "NotFound", &format!("{m} {path}")),
        })
    }

    /// Adds or replaces a pod and sends the watch event.
    fn put_pod(&self, mut pod: Pod) -> Pod {
        let name = pod.metadata.name.clone().unwrap();
        let mut st = self.state();
        let kind = if st.pods.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        st.rv += 1;
        pod.metadata.resource_version = Some(st.rv.to_string());
        st.pods.insert(name, pod.clone());
        Self::emit(&mut st, kind, pod.clone());
        pod
    }

    fn delete_pod(&self, name: &str) {
        let mut st = self.state();
        let mut pod = st.pods.remove(name).expect("pod to delete");
        st.rv += 1;
        pod.metadata.resource_version = Some(st.rv.to_string());
        Self::emit(&mut st, "DELETED", pod);
    }

    fn emit(st: &mut ApiState, kind: &str, pod: Pod) {
        let line = format!("{}\n", json!({"type": kind, "object": pod}));
        let rv = st.rv;
        st.events.push((rv, pod.clone(), line.clone()));
        st.watchers.retain(|(selector, tx)| {
            !selects(selector, &pod)
                || tx
                    .unbounded_send(Ok(Frame::data(line.clone().into())))
                    .is_ok()
        });
    }

    /// Down: every request fails to connect and open watches are cut.
    fn set_down(&self, down: bool) {
        let mut st = self.state();
        st.down = down;
        if down {
            st.watchers.clear();
        }
    }

    fn set_lease(&self, holder: &str) {
        let mut st = self.state();
        st.rv += 1;
        let mut lease = st.lease.clone().unwrap_or(Lease {
            metadata: ObjectMeta {
                name: Some(LEASE.into()),
                namespace: Some(NS.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec::default()),
        });
        lease.metadata.resource_version = Some(st.rv.to_string());
        let spec = lease.spec.get_or_insert_default();
        spec.holder_identity = Some(holder.into());
        spec.lease_duration_seconds = Some(15);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        st.lease = Some(lease);
    }

    fn lease(&self) -> Option<LeaseSpec> {
        self.state().lease.clone().and_then(|l| l.spec)
    }

    fn holder(&self) -> Option<String> {
        self.lease().and_then(|s| s.holder_identity)
    }

    fn requests(&self) -> Vec<String> {
        self.state().log.clone()
    }
}

fn agent_pod(name: &str, node: &str, host_ip: &str, ready: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/name".into(), "clockmesh".into()),
                ("app.kubernetes.io/component".into(), "agent".into()),
            ])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            host_ip: Some(host_ip.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

fn set_ready(mut pod: Pod, ready: bool) -> Pod {
    let st = pod.status.as_mut().unwrap();
    st.conditions.as_mut().unwrap()[0].status = if ready { "True" } else { "False" }.into();
    pod
}

fn timing() -> Timing {
    Timing {
        lease_duration: Duration::from_secs(15),
        renew_period: Duration::from_millis(50),
        request_timeout: Duration::from_secs(2),
        sync_timeout: Duration::from_secs(5),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
    }
}

fn discovery(api: &FakeApi, pod: &str) -> KubeDiscovery {
    KubeDiscovery::with_client(
        api.client(),
        KubeConfig {
            namespace: NS.into(),
            selector: SELECTOR.into(),
            lease: LEASE.into(),
            probe_port: FALLBACK_PORT,
            pod_name: Some(pod.into()),
        },
        timing(),
    )
}

fn member(name: &str, addr: &str, capabilities: u32) -> Member {
    let a: SocketAddr = addr.parse().unwrap();
    Member {
        name: name.into(),
        id: 0,
        addr: a.ip(),
        probe_port: a.port(),
        capabilities,
    }
}

/// (name, address, capabilities) of each member.
async fn view(d: &mut KubeDiscovery) -> Vec<(String, String, u32)> {
    d.members()
        .await
        .unwrap()
        .into_iter()
        .map(|m| (m.name.clone(), m.probe_addr().to_string(), m.capabilities))
        .collect()
}

/// Polls `members()` until `want` holds (5 s at most).
async fn until_members(d: &mut KubeDiscovery, what: &str, want: impl Fn(&[String]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let names: Vec<String> = view(d).await.into_iter().map(|m| m.0).collect();
        if want(&names) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: members stayed {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The usual cluster: a (us), b Ready; c not Ready; e being deleted; a
/// training pod outside the selector.
fn cluster() -> FakeApi {
    let api = FakeApi::default();
    api.put_pod(agent_pod("agent-a", "node-a", "198.18.0.1", true));
    api.put_pod(agent_pod("agent-b", "node-b", "198.18.0.2", true));
    api.put_pod(agent_pod("agent-c", "node-c", "198.18.0.3", false));
    let mut e = agent_pod("agent-e", "node-e", "198.18.0.5", true);
    e.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    api.put_pod(e);
    let mut training = agent_pod("trainer-0", "node-t", "198.18.0.9", true);
    training.metadata.labels = Some(BTreeMap::from([("app".into(), "trainer".into())]));
    api.put_pod(training);
    api
}

// ------------------------------------------------------------------ ids

#[test]
fn ids_are_deterministic_unique_and_order_independent() {
    let mut list: Vec<String> = (0..5000).map(|i| format!("gpu-node-{i:05}")).collect();
    let a = assign_ids(list.iter().map(String::as_str));
    list.reverse();
    let b = assign_ids(list.iter().map(String::as_str).chain(["gpu-node-00007"]));
    assert_eq!(a, b, "same names, any order or repetition: same ids");
    let unique: BTreeSet<u32> = a.values().copied().collect();
    assert_eq!(unique.len(), 5000);
    assert!(!unique.contains(&0));
    // Without collisions an id is the name's hash, whatever else is listed.
    assert_eq!(a["gpu-node-00042"], name_hash("gpu-node-00042"));
    let alone = assign_ids(["gpu-node-00042"]);
    assert_eq!(alone["gpu-node-00042"], a["gpu-node-00042"]);
    // FNV-1a 32 reference values.
    assert_eq!(name_hash(""), 0x811c_9dc5);
    assert_eq!(name_hash("a"), 0xe40c_292c);
    assert_eq!(name_hash("foobar"), 0xbf9c_f968);
}

#[test]
fn id_collisions_resolve_in_name_order() {
    // Every name hashes to the same value: sorted names take it and the
    // values after it; 0 is skipped after wrapping.
    let ids = assign_ids_by(["c", "a", "b", "d"], |_| u32::MAX - 1);
    let got: Vec<(&str, u32)> = ids.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        got,
        [("a", u32::MAX - 1), ("b", u32::MAX), ("c", 1), ("d", 2)]
    );
    let zero = assign_ids_by(["x"], |_| 0);
    assert_eq!(zero["x"], 1, "0 is never an id");

    // A real FNV collision between two node names.
    let mut seen: std::collections::HashMap<u32, String> = Default::default();
    let (first, second) = (0u32..)
        .find_map(|i| {
            let name = format!("node-{i}");
            let other = seen.insert(name_hash(&name), name.clone())?;
            Some(if other < name {
                (other, name)
            } else {
                (name, other)
            })
        })
        .unwrap();
    let h = name_hash(&first);
    assert_eq!(name_hash(&second), h);
    for order in [[&first, &second], [&second, &first]] {
        let ids = assign_ids(order.iter().map(|s| s.as_str()));
        assert_eq!(ids[&first], h, "the name sorting first keeps its hash");
        assert_eq!(ids[&second], h.wrapping_add(1).max(1));
    }
    // Members computed from the pods use exactly these ids.
    let members = check_unique(
        &assign_ids([first.as_str(), second.as_str()])
            .into_iter()
            .map(|(name, id)| Member {
                id,
                ..member(&name, "198.18.0.1:1", 0)
            })
            .collect::<Vec<_>>(),
    );
    assert!(members.is_ok());
}

// -------------------------------------------------------------- members

#[tokio::test]
async fn members_follow_the_pod_watch() {
    let api = cluster();
    let mut d = discovery(&api, "agent-a");
    let me = d
        .register(&member("node-a", "198.18.0.1:31900", 5))
        .await
        .unwrap();
    // Ids over every scheduled pod (c too, not Ready yet; e is being deleted).
    let ids = assign_ids(["node-a", "node-b", "node-c"]);
    assert_eq!(me.id, ids["node-a"]);
    assert_eq!(
        (
            me.name.as_str(),
            me.probe_addr().to_string(),
            me.capabilities
        ),
        ("node-a", "198.18.0.1:31900".into(), 5)
    );
    // register wrote our address on our pod.
    let ours = api.state().pods["agent-a"]
        .metadata
        .annotations
        .clone()
        .unwrap();
    assert_eq!(ours[PROBE_ADDR_ANNOTATION], "198.18.0.1:31900");
    assert_eq!(ours[CAPABILITIES_ANNOTATION], "5");
    let log = api.requests();
    assert!(
        log.iter()
            .any(|r| r.starts_with("PATCH /api/v1/namespaces/clockmesh/pods/agent-a")),
        "{log:?}"
    );
    assert!(
        log.iter()
            .any(|r| r.starts_with("GET /api/v1/namespaces/clockmesh/pods?")
                && r.contains("labelSelector=app.kubernetes.io%2Fname%3Dclockmesh")),
        "the list uses the selector: {log:?}"
    );

    let got = d.members().await.unwrap();
    assert_eq!(
        got.iter()
            .map(|m| (m.name.as_str(), m.id))
            .collect::<Vec<_>>(),
        [("node-a", ids["node-a"]), ("node-b", ids["node-b"])],
        "Ready pods only; not c (NotReady), e (deleting) or the training pod"
    );
    // b has no annotation: host IP and the configured port.
    assert_eq!(
        view(&mut d).await,
        [
            ("node-a".into(), "198.18.0.1:31900".into(), 5),
            ("node-b".into(), format!("198.18.0.2:{FALLBACK_PORT}"), 0),
        ]
    );

    // c turns Ready.
    let c = api.state().pods["agent-c"].clone();
    api.put_pod(set_ready(c, true));
    until_members(&mut d, "c Ready", |n| {
        n == names(&["node-a", "node-b", "node-c"])
    })
    .await;

    // b turns NotReady.
    let b = api.state().pods["agent-b"].clone();
    api.put_pod(set_ready(b, false));
    until_members(&mut d, "b NotReady", |n| n == names(&["node-a", "node-c"])).await;

    // A new agent on node d, with its own probe address annotation.
    let mut dd = agent_pod("agent-d", "node-d", "198.18.0.4", true);
    dd.metadata.annotations = Some(BTreeMap::from([
        (PROBE_ADDR_ANNOTATION.into(), "10.1.2.4:31901".into()),
        (CAPABILITIES_ANNOTATION.into(), "3".into()),
    ]));
    api.put_pod(dd);
    until_members(&mut d, "d added", |n| n.contains(&"node-d".to_string())).await;
    let got = d.members().await.unwrap();
    let md = got.iter().find(|m| m.name == "node-d").unwrap();
    assert_eq!(
        (md.probe_addr().to_string(), md.capabilities),
        ("10.1.2.4:31901".into(), 3)
    );
    let ids = assign_ids(["node-a", "node-b", "node-c", "node-d"]);
    assert!(got.iter().all(|m| m.id == ids[&m.name]), "{got:?}");

    // c is deleted.
    api.delete_pod("agent-c");
    until_members(&mut d, "c deleted", |n| n == names(&["node-a", "node-d"])).await;

    // Our own pod going NotReady does not drop us from our own list.
    let a = api.state().pods["agent-a"].clone();
    api.put_pod(set_ready(a, false));
    let b = api.state().pods["agent-b"].clone();
    api.put_pod(set_ready(b, true));
    until_members(&mut d, "b back", |n| n.contains(&"node-b".to_string())).await;
    assert_eq!(
        view(&mut d)
            .await
            .into_iter()
            .map(|m| m.0)
            .collect::<Vec<_>>(),
        names(&["node-a", "node-b", "node-d"])
    );
    d.leave().await.unwrap();
}

#[tokio::test]
async fn unreachable_api_keeps_the_last_known_members() {
    let api = cluster();
    let mut d = discovery(&api, "agent-a");
    d.register(&member("node-a", "198.18.0.1:31900", 0))
        .await
        .unwrap();
    let before = d.members().await.unwrap();
    assert_eq!(before.len(), 2);
    assert!(
        d.leadership().await.unwrap().is_me,
        "first agent takes the Lease"
    );

    api.set_down(true);
    // While the API server is away, b is deleted and c turns Ready there:
    // nobody can see it.
    api.delete_pod("agent-b");
    let c = api.state().pods["agent-c"].clone();
    api.put_pod(set_ready(c, true));
    let deadline = Instant::now() + Duration::from_secs(5);
    while lock(&d.shared).outage().is_none() {
        assert!(Instant::now() < deadline, "the outage was never noticed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(d.members().await.unwrap(), before, "last known members");
    assert!(d.outage_logged, "the outage is logged (once)");
    // The renew fails: we stop claiming, and the last holder stays the reference.
    let deadline = Instant::now() + Duration::from_secs(5);
    while d.leadership().await.unwrap().is_me {
        assert!(Instant::now() < deadline, "still claiming leadership");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let l = d.leadership().await.unwrap();
    assert_eq!((l.leader.as_deref(), l.is_me), (Some("node-a"), false));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        d.members().await.unwrap(),
        before,
        "still the last known members"
    );

    // Back: the watch relists and the lease loop renews.
    api.set_down(false);
    until_members(&mut d, "relist after the outage", |n| {
        n == names(&["node-a", "node-c"])
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !d.leadership().await.unwrap().is_me {
        assert!(
            Instant::now() < deadline,
            "leadership not renewed after the outage"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!d.outage_logged, "recovery is noticed");
    d.leave().await.unwrap();
}

#[tokio::test]
async fn register_errors_say_what_to_fix() {
    let api = cluster();
    let err = discovery(&api, "agent-zz")
        .register(&member("node-a", "198.18.0.1:31900", 0))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("POD_NAME"), "{err}");
    let err = discovery(&api, "agent-b")
        .register(&member("node-a", "198.18.0.1:31900", 0))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("runs on node \"node-b\"") && err.contains("spec.nodeName"),
        "{err}"
    );
    api.set_down(true);
    let err = discovery(&api, "agent-a")
        .register(&member("node-a", "198.18.0.1:31900", 0))
        .await
        .unwrap_err();
    assert!(matches!(err, DiscoveryError::Unavailable(_)), "{err}");
}

// ---------------------------------------------------------------- Lease

fn elector(api: &FakeApi, me: &str) -> (Elector, SharedState) {
    let d = discovery(api, "unused");
    let e = d.elector(me);
    (e, d.shared.clone())
}

fn claim(shared: &SharedState) -> (Option<String>, bool) {
    let s = lock(shared);
    (s.leader.clone(), s.holding)
}

#[tokio::test]
async fn lease_is_created_when_absent_and_renewed() {
    let api = FakeApi::default();
    let (mut e, shared) = elector(&api, "node-a");
    let t0 = Instant::now();
    e.step(t0).await;
    assert_eq!(claim(&shared), (Some("node-a".into()), true));
    let spec = api.lease().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("node-a"));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.lease_transitions, Some(0));
    let renewed_at = spec.renew_time.clone().unwrap();
    let acquired_at = spec.acquire_time.clone().unwrap();

    e.step(t0 + Duration::from_secs(5)).await;
    assert_eq!(claim(&shared), (Some("node-a".into()), true));
    let spec = api.lease().unwrap();
    assert!(spec.renew_time.unwrap() > renewed_at, "renewTime moves");
    assert_eq!(spec.acquire_time.unwrap(), acquired_at, "acquireTime stays");
    assert_eq!(spec.lease_transitions, Some(0));
    let puts = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("PUT "))
        .count();
    assert_eq!(puts, 1, "one renew");
}

#[tokio::test]
async fn lease_held_by_a_live_agent_is_not_taken() {
    let api = FakeApi::default();
    api.set_lease("node-b");
    let (mut e, shared) = elector(&api, "node-a");
    let t0 = Instant::now();
    e.step(t0).await;
    assert_eq!(claim(&shared), (Some("node-b".into()), false));
    // b renews every 5 s; we look every 5 s for a minute: never taken.
    for i in 1..=12 {
        api.set_lease("node-b");
        e.step(t0 + Duration::from_secs(5 * i)).await;
        assert_eq!(claim(&shared), (Some("node-b".into()), false), "step {i}");
    }
    assert_eq!(api.holder().as_deref(), Some("node-b"));
    assert!(!api.requests().iter().any(|r| r.starts_with("PUT ")));
}

#[tokio::test]
async fn expired_lease_is_taken_over() {
    let api = FakeApi::default();
    api.set_lease("node-b");
    let (mut e, shared) = elector(&api, "node-a");
    let t0 = Instant::now();
    // A record we see for the first time is fresh to us, however old its
    // renewTime: expiry counts on our own clock from when we saw it.
    e.step(t0).await;
    e.step(t0 + Duration::from_secs(10)).await;
    assert_eq!(claim(&shared), (Some("node-b".into()), false));
    assert_eq!(api.holder().as_deref(), Some("node-b"));
    // b stopped renewing: 15 s after we first saw the record, it is ours.
    e.step(t0 + Duration::from_secs(15)).await;
    assert_eq!(claim(&shared), (Some("node-a".into()), true));
    let spec = api.lease().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("node-a"));
    assert_eq!(spec.lease_transitions, Some(1));
    assert_eq!(spec.lease_duration_seconds, Some(15));
}

#[tokio::test]
async fn a_concurrent_takeover_wins_over_a_stale_write() {
    let api = FakeApi::default();
    api.set_lease("node-b");
    let (mut a, shared_a) = elector(&api, "node-a");
    let (mut c, shared_c) = elector(&api, "node-c");
    let t0 = Instant::now();
    a.step(t0).await;
    c.step(t0).await;
    // Both see it expire; c writes first, a's write carries a stale resourceVersion.
    c.step(t0 + Duration::from_secs(16)).await;
    a.step(t0 + Duration::from_secs(16)).await;
    assert_eq!(claim(&shared_c), (Some("node-c".into()), true));
    assert!(!claim(&shared_a).1, "a must not claim after a conflict");
    // a's next look sees c's fresh record.
    a.step(t0 + Duration::from_secs(21)).await;
    assert_eq!(claim(&shared_a), (Some("node-c".into()), false));
    assert_eq!(api.holder().as_deref(), Some("node-c"));
}

#[tokio::test]
async fn failed_renew_stops_the_claim() {
    let api = FakeApi::default();
    let (mut e, shared) = elector(&api, "node-a");
    let t0 = Instant::now();
    e.step(t0).await;
    assert!(claim(&shared).1);
    // Unreachable: the renew fails, we stop claiming at once.
    api.set_down(true);
    e.step(t0 + Duration::from_secs(5)).await;
    assert_eq!(claim(&shared), (Some("node-a".into()), false));
    assert!(lock(&shared).outage().is_some());
    // Someone else took the Lease meanwhile (it looked expired to them).
    api.set_down(false);
    api.set_lease("node-b");
    e.step(t0 + Duration::from_secs(10)).await;
    assert_eq!(claim(&shared), (Some("node-b".into()), false));
    assert!(lock(&shared).outage().is_none());
}

#[tokio::test]
async fn released_lease_is_taken_at_once_and_only_the_holder_releases() {
    let api = FakeApi::default();
    let (mut a, shared_a) = elector(&api, "node-a");
    let (mut b, shared_b) = elector(&api, "node-b");
    let t0 = Instant::now();
    a.step(t0).await;
    b.step(t0).await;
    assert_eq!(claim(&shared_b), (Some("node-a".into()), false));
    // b cannot release what it does not hold.
    assert!(!b.release().await.unwrap());
    assert_eq!(api.holder().as_deref(), Some("node-a"));
    assert!(a.release().await.unwrap());
    let spec = api.lease().unwrap();
    assert_eq!(
        spec.holder_identity.as_deref(),
        Some(""),
        "client-go release"
    );
    assert_eq!(spec.lease_duration_seconds, Some(1));
    // A released Lease is free: b takes it on its next step, no waiting.
    b.step(t0 + Duration::from_secs(1)).await;
    assert_eq!(claim(&shared_b), (Some("node-b".into()), true));
    assert_eq!(api.holder().as_deref(), Some("node-b"));
    drop(shared_a);
}

#[tokio::test]
async fn leave_releases_the_lease_and_stops_the_watch() {
    let api = cluster();
    let mut d = discovery(&api, "agent-a");
    d.register(&member("node-a", "198.18.0.1:31900", 0))
        .await
        .unwrap();
    assert_eq!(
        d.leadership().await.unwrap(),
        Leadership {
            leader: Some("node-a".into()),
            is_me: true
        }
    );
    d.leave().await.unwrap();
    assert_eq!(api.holder().as_deref(), Some(""), "released");
    assert_eq!(api.lease().unwrap().lease_duration_seconds, Some(1));
    assert!(!d.leadership().await.unwrap().is_me);
    // No more watch or lease traffic, and open watch streams are closed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let n = api.requests().len();
    api.put_pod(agent_pod("agent-f", "node-f", "198.18.0.6", true));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(api.requests().len(), n, "requests after leave");
    assert!(
        api.state().watchers.is_empty(),
        "the watch stream was dropped"
    );
    // A second agent now takes the Lease at once.
    let mut d2 = discovery(&api, "agent-b");
    d2.register(&member("node-b", "198.18.0.2:31900", 0))
        .await
        .unwrap();
    assert!(d2.leadership().await.unwrap().is_me);
    d2.leave().await.unwrap();
}

#[tokio::test]
async fn per_window_exchange_never_reaches_the_api_server() {
    let api = cluster();
    let mut d = discovery(&api, "agent-a");
    // No store at all: the type says so, and the protocol core relays.
    assert!(d.store().is_none());
    assert_eq!(d.exchange(), clockmesh_core::node::Exchange::Relay);
    assert!(api.requests().is_empty(), "nothing goes to the API server");
}
