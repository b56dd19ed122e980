//! Estimator results ⇄ the protobuf messages exchanged through etcd.

use clockmesh_estimator::{EdgeFit, EdgeMeasurement, NodeId};
use clockmesh_proto::clockmesh as pb;

/// An edge fit of `window` as sent to the leader, fitted over
/// `history_share` of a full history ([`EdgeMeasurement::history_share`]).
pub fn edge_to_pb(
    window: u64,
    (from, from_name): (NodeId, &str),
    (to, to_name): (NodeId, &str),
    fit: &EdgeFit,
    history_share: f64,
) -> pb::EdgeFit {
    pb::EdgeFit {
        from_node: from_name.to_owned(),
        to_node: to_name.to_owned(),
        anchor_ns: fit.epoch_ns,
        offset_ns: fit.offset_base_ns,
        drift_ppb: fit.drift * 1e9,
        bound_ns: fit.bound_ns.ceil().max(0.0) as u64,
        pure_pairs: (fit.forward_points + fit.backward_points) as u32,
        window,
        from_id: from,
        to_id: to,
        offset_frac_ns: fit.offset_rel_ns,
        bound_exact_ns: fit.bound_ns,
        drift_bound_ppb: fit.drift_bound * 1e9,
        margin_ns: fit.margin_ns,
        min_rtt_ns: fit.min_rtt_ns,
        forward_points: fit.forward_points as u32,
        backward_points: fit.backward_points as u32,
        trimmed: fit.trimmed as u32,
        span_ns: fit.span_ns,
        history_share,
    }
}

/// The measurement the network solve takes; `None` for nonsense values
/// (a peer running a broken or hostile agent must not poison the solve).
pub fn edge_from_pb(e: &pb::EdgeFit) -> Option<EdgeMeasurement> {
    let finite = [
        e.drift_ppb,
        e.offset_frac_ns,
        e.bound_exact_ns,
        e.drift_bound_ppb,
        e.margin_ns,
        e.min_rtt_ns,
    ]
    .iter()
    .all(|v| v.is_finite());
    let sane = finite
        && e.from_id != e.to_id
        && e.bound_exact_ns > 0.0
        && e.drift_bound_ppb >= 0.0
        && e.drift_ppb.abs() < 1e6
        && (0.0..=1.0).contains(&e.history_share);
    sane.then(|| {
        EdgeMeasurement::new(
            e.from_id,
            e.to_id,
            EdgeFit {
                epoch_ns: e.anchor_ns,
                offset_base_ns: e.offset_ns,
                offset_rel_ns: e.offset_frac_ns,
                drift: e.drift_ppb / 1e9,
                margin_ns: e.margin_ns,
                min_rtt_ns: e.min_rtt_ns,
                bound_ns: e.bound_exact_ns,
                drift_bound: e.drift_bound_ppb / 1e9,
                forward_points: e.forward_points as usize,
                backward_points: e.backward_points as usize,
                trimmed: e.trimmed as usize,
                span_ns: e.span_ns,
            },
        )
        .with_history_share(if e.history_share > 0.0 {
            e.history_share
        } else {
            1.0 // an older agent's fit: it did not say
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_fits_survive_the_round_trip() {
        let fit = EdgeFit {
            epoch_ns: 1_700_000_000_000_000_000,
            offset_base_ns: -12_345,
            offset_rel_ns: 0.25,
            drift: 3.5e-8,
            margin_ns: 400.0,
            min_rtt_ns: 800.0,
            bound_ns: 410.5,
            drift_bound: 1e-9,
            forward_points: 30,
            backward_points: 31,
            trimmed: 1,
            span_ns: 4_000_000_000,
        };
        let p = edge_to_pb(9, (1, "a"), (2, "b"), &fit, 0.25);
        assert_eq!((p.bound_ns, p.pure_pairs, p.window), (411, 61, 9));
        let m = edge_from_pb(&p).unwrap();
        assert_eq!((m.from, m.to), (1, 2));
        assert_eq!(m.history_share, 0.25);
        let older_agent = pb::EdgeFit {
            history_share: 0.0,
            ..p.clone()
        };
        assert_eq!(edge_from_pb(&older_agent).unwrap().history_share, 1.0);
        let absurd = pb::EdgeFit {
            history_share: 3.0,
            ..p.clone()
        };
        assert!(edge_from_pb(&absurd).is_none());
        assert_eq!(m.fit.offset_base_ns, fit.offset_base_ns);
        assert!((m.fit.drift - fit.drift).abs() < 1e-20);
        assert_eq!(m.fit.bound_ns, fit.bound_ns);
        let mut bad = p.clone();
        bad.drift_ppb = f64::NAN;
        assert!(edge_from_pb(&bad).is_none());
        bad = p;
        bad.to_id = bad.from_id;
        assert!(edge_from_pb(&bad).is_none());
    }
}
