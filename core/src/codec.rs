//! The protocol's domain types ⇄ what carries them: edge fits and node
//! results to and from the protobuf messages of the relay and the store,
//! and a result read back from the offsets file. The only place in core
//! that knows the wire's types.

use crate::time::Nanos;
use clockmesh_estimator::convert::{ceil_bound_ns, count_u32, ns_f64, unsigned_ns_f64};
use clockmesh_estimator::{EdgeFit, EdgeMeasurement, NodeId};
use clockmesh_offsets::history::AnchorKind;
use clockmesh_offsets::{Record, flags};
use clockmesh_proto::{clockmesh as pb, prost::Message as _};

use crate::fits::{SharedFit, WindowFits};
use crate::result::NodeResult;
use crate::time::{LocalNs, WindowIndex};

/// A node's result as the relay and the store carry it.
pub fn result_to_pb(r: &NodeResult) -> pb::NodeOffset {
    pb::NodeOffset {
        node: r.node_name.clone(),
        anchor_ns: r.anchor.0,
        offset_ns: r.offset.0,
        drift_ppb: r.drift_ppb,
        bound_ns: r.bound_ns,
        reference_node: r.reference_name.clone().unwrap_or_default(),
        window: r.window.0,
        valid_until_ns: u64::try_from(r.valid_until.0).unwrap_or(0),
        devices: Vec::new(),
        bound_growth_ppb: r.bound_growth_ppb,
        node_id: r.node,
        reference_id: r.reference,
        anchor_kind: r.anchor_kind.as_str().into(),
        drift_bound_ppb: r.drift_bound_ppb,
        hops: r.hops,
        timeline_origin: r.origin.clone().unwrap_or_default(),
    }
}

/// A result off the relay or the store; `None` for nonsense (non-finite
/// rates, a negative bound growth, an anchor kind this version does not
/// know). An empty anchor kind is an older agent's: solved against the
/// reference.
pub fn result_from_pb(r: &pb::NodeOffset) -> Option<NodeResult> {
    let rates = [r.drift_ppb, r.bound_growth_ppb, r.drift_bound_ppb];
    let sane = rates.iter().all(|v| v.is_finite()) && r.bound_growth_ppb >= 0.0;
    let anchor_kind = match r.anchor_kind.as_str() {
        "" => Some(AnchorKind::Reference),
        name => AnchorKind::from_name(name),
    }?;
    sane.then(|| NodeResult {
        node: r.node_id,
        node_name: r.node.clone(),
        reference: r.reference_id,
        reference_name: (!r.reference_node.is_empty()).then(|| r.reference_node.clone()),
        origin: (!r.timeline_origin.is_empty()).then(|| r.timeline_origin.clone()),
        window: WindowIndex(r.window),
        anchor: LocalNs(r.anchor_ns),
        offset: Nanos(r.offset_ns),
        drift_ppb: r.drift_ppb,
        bound_ns: r.bound_ns,
        bound_growth_ppb: r.bound_growth_ppb,
        drift_bound_ppb: r.drift_bound_ppb,
        hops: r.hops,
        valid_until: LocalNs(i64::try_from(r.valid_until_ns).unwrap_or(i64::MAX)),
        anchor_kind,
    })
}

/// The result a previous agent of node `(id, name)` published in the
/// offsets file, read back after a restart: in holdover (no solve placed
/// it now), its reference known by id only. `None` without one, or
/// flagged stale. The file carries no drift bound of its own.
pub fn result_from_record(r: &Record, (id, name): (NodeId, &str)) -> Option<NodeResult> {
    if r.flags & flags::VALID == 0 || r.flags & flags::STALE != 0 {
        return None;
    }
    Some(NodeResult {
        node: id,
        node_name: name.to_owned(),
        reference: u32::try_from(r.reference_id).ok()?,
        reference_name: None,
        origin: None,
        window: WindowIndex(r.window),
        anchor: LocalNs(r.node.anchor_local_ns),
        offset: Nanos(r.node.offset_ns),
        drift_ppb: ns_f64(r.node.drift_ps_per_s) / 1e3,
        bound_ns: r.node.bound_ns,
        bound_growth_ppb: unsigned_ns_f64(r.node.bound_growth_ps_per_s) / 1e3,
        drift_bound_ppb: 0.0,
        hops: 0,
        valid_until: LocalNs(r.valid_until_ns),
        anchor_kind: AnchorKind::Holdover,
    })
}

/// An edge fit as the relay and the store carry it.
pub fn fit_to_pb(f: &SharedFit) -> pb::EdgeFit {
    let fit = &f.measurement.fit;
    pb::EdgeFit {
        from_node: f.from_name.clone(),
        to_node: f.to_name.clone(),
        anchor_ns: fit.epoch_ns,
        offset_ns: fit.offset_base_ns,
        drift_ppb: fit.drift * 1e9,
        bound_ns: ceil_bound_ns(fit.bound_ns),
        pure_pairs: count_u32(fit.forward_points + fit.backward_points),
        window: f.window.0,
        from_id: f.from(),
        to_id: f.to(),
        offset_frac_ns: fit.offset_rel_ns,
        bound_exact_ns: fit.bound_ns,
        drift_bound_ppb: fit.drift_bound * 1e9,
        margin_ns: fit.margin_ns,
        min_rtt_ns: fit.min_rtt_ns,
        forward_points: count_u32(fit.forward_points),
        backward_points: count_u32(fit.backward_points),
        trimmed: count_u32(fit.trimmed),
        span_ns: fit.span_ns,
        history_share: f.measurement.history_share,
    }
}

/// An edge fit off the relay or the store; `None` for nonsense values (a
/// peer running a broken or hostile agent must not poison the solve).
pub fn fit_from_pb(e: &pb::EdgeFit) -> Option<SharedFit> {
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
    sane.then(|| SharedFit {
        window: WindowIndex(e.window),
        from_name: e.from_node.clone(),
        to_name: e.to_node.clone(),
        measurement: EdgeMeasurement::new(
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
        }),
    })
}

/// A node's fits of a window as the store keeps them.
pub fn window_fits_to_pb(w: &WindowFits) -> pb::Snapshot {
    pb::Snapshot {
        window: w.window.0,
        produced_at_ns: w.produced_at.0,
        edges: w.fits.iter().map(fit_to_pb).collect(),
        nodes: Vec::new(),
    }
}

/// A node's fits of a window off the store; nonsense fits are left out.
pub fn window_fits_from_pb(s: &pb::Snapshot) -> WindowFits {
    WindowFits {
        window: WindowIndex(s.window),
        produced_at: LocalNs(s.produced_at_ns),
        fits: s.edges.iter().filter_map(fit_from_pb).collect(),
    }
}

/// Why a record off the relay or the store was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("not a record of this protocol")]
    Malformed,
    #[error("a record with nonsense values")]
    Nonsense,
}

pub fn encode_fit(f: &SharedFit) -> Vec<u8> {
    fit_to_pb(f).encode_to_vec()
}

pub fn decode_fit(bytes: &[u8]) -> Result<SharedFit, RecordError> {
    let decoded = pb::EdgeFit::decode(bytes).map_err(|_| RecordError::Malformed)?;
    fit_from_pb(&decoded).ok_or(RecordError::Nonsense)
}

pub fn encode_result(r: &NodeResult) -> Vec<u8> {
    result_to_pb(r).encode_to_vec()
}

pub fn decode_result(bytes: &[u8]) -> Result<NodeResult, RecordError> {
    let decoded = pb::NodeOffset::decode(bytes).map_err(|_| RecordError::Malformed)?;
    result_from_pb(&decoded).ok_or(RecordError::Nonsense)
}

pub fn encode_window_fits(w: &WindowFits) -> Vec<u8> {
    window_fits_to_pb(w).encode_to_vec()
}

pub fn decode_window_fits(bytes: &[u8]) -> Result<WindowFits, RecordError> {
    let decoded = pb::Snapshot::decode(bytes).map_err(|_| RecordError::Malformed)?;
    Ok(window_fits_from_pb(&decoded))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publication::Publication;
    use crate::settings::Settings;

    #[test]
    fn results_survive_the_wire_and_the_offsets_file() {
        let r = NodeResult {
            node: 4,
            node_name: "n4".into(),
            reference: 2,
            reference_name: Some("n2".into()),
            origin: Some("n0".into()),
            window: WindowIndex(9),
            anchor: LocalNs(36_000_000_000),
            offset: Nanos(-37_000_123),
            drift_ppb: 20_000.25,
            bound_ns: 310,
            bound_growth_ppb: 12.5,
            drift_bound_ppb: 2.5,
            hops: 2,
            valid_until: LocalNs(48_000_000_000),
            anchor_kind: AnchorKind::Reference,
        };
        assert_eq!(result_from_pb(&result_to_pb(&r)), Some(r.clone()));
        let bad_kind = pb::NodeOffset {
            anchor_kind: "guessed".into(),
            ..result_to_pb(&r)
        };
        assert_eq!(result_from_pb(&bad_kind), None);
        let older = pb::NodeOffset {
            anchor_kind: String::new(),
            ..result_to_pb(&r)
        };
        assert_eq!(
            result_from_pb(&older).map(|o| o.anchor_kind),
            Some(AnchorKind::Reference)
        );
        // An older agent names no origin: nobody steers the timeline toward one.
        let no_origin = pb::NodeOffset {
            timeline_origin: String::new(),
            ..result_to_pb(&r)
        };
        assert_eq!(result_from_pb(&no_origin).unwrap().origin, None);
        let nan = pb::NodeOffset {
            drift_ppb: f64::NAN,
            ..result_to_pb(&r)
        };
        assert_eq!(result_from_pb(&nan), None);

        // Published and read back after a restart: the same clock, in
        // holdover, its reference known by id.
        let record = Publication::of(r.clone(), &Settings::default()).record(
            LocalNs(37_000_000_000),
            Default::default(),
            Vec::new(),
        );
        let back = result_from_record(&record, (4, "n4")).unwrap();
        assert_eq!(
            (back.anchor, back.offset, back.bound_ns, back.window),
            (r.anchor, r.offset, r.bound_ns, r.window)
        );
        assert_eq!((back.reference, back.reference_name.as_deref()), (2, None));
        assert_eq!(back.origin, None);
        assert_eq!(back.anchor_kind, AnchorKind::Holdover);
        assert!((back.drift_ppb - r.drift_ppb).abs() < 1e-3);
        let stale = Record {
            flags: record.flags | flags::STALE,
            ..record
        };
        assert_eq!(result_from_record(&stale, (4, "n4")), None);
    }

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
        let shared = SharedFit {
            window: WindowIndex(9),
            from_name: "a".into(),
            to_name: "b".into(),
            measurement: EdgeMeasurement::new(1, 2, fit.clone()).with_history_share(0.25),
        };
        let p = fit_to_pb(&shared);
        assert_eq!((p.bound_ns, p.pure_pairs, p.window), (411, 61, 9));
        let back = fit_from_pb(&p).unwrap();
        assert_eq!(
            (back.from_name.as_str(), back.window),
            ("a", WindowIndex(9))
        );
        let m = back.measurement;
        assert_eq!((m.from, m.to), (1, 2));
        assert_eq!(m.history_share, 0.25);
        let older_agent = pb::EdgeFit {
            history_share: 0.0,
            ..p.clone()
        };
        assert_eq!(
            fit_from_pb(&older_agent).unwrap().measurement.history_share,
            1.0
        );
        let absurd = pb::EdgeFit {
            history_share: 3.0,
            ..p.clone()
        };
        assert!(fit_from_pb(&absurd).is_none());
        assert_eq!(m.fit.offset_base_ns, fit.offset_base_ns);
        assert!((m.fit.drift - fit.drift).abs() < 1e-20);
        assert_eq!(m.fit.bound_ns, fit.bound_ns);
        let window = WindowFits {
            window: WindowIndex(9),
            produced_at: LocalNs(5),
            fits: vec![shared.clone()],
        };
        let mut stored = window_fits_to_pb(&window);
        stored.edges.push(absurd.clone());
        // The store's record keeps the sane fits and leaves nonsense out.
        let back = decode_window_fits(&stored.encode_to_vec()).unwrap();
        assert_eq!(back.fits.len(), 1);
        assert_eq!(decode_fit(&encode_fit(&shared)).unwrap().to(), 2);
        assert_eq!(
            decode_fit(&absurd.encode_to_vec()),
            Err(RecordError::Nonsense)
        );
        assert_eq!(decode_fit(&[0xff, 0xff]), Err(RecordError::Malformed));
        let mut bad = p.clone();
        bad.drift_ppb = f64::NAN;
        assert!(fit_from_pb(&bad).is_none());
        bad = p;
        bad.to_id = bad.from_id;
        assert!(fit_from_pb(&bad).is_none());
    }
}
