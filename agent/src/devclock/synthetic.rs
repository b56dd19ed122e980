//! A modelled device clock read against the real host clocks: lets the
//! sampler, the fitter and the CLI run end to end on a machine with no GPU.
use clockmesh_core::time::LocalNs;
use clockmesh_estimator::device::{
    HostStamp, SnapshotPair, SourceKind, SyntheticClockModel, SyntheticConfig,
};

use super::{DevClockError, DeviceClockSource, SourceInfo, host};

pub struct SyntheticSource {
    model: SyntheticClockModel,
    info: SourceInfo,
}

impl SyntheticSource {
    /// The model's truth starts at the current host REALTIME.
    pub fn new(config: SyntheticConfig) -> Result<Self, DevClockError> {
        let quantum_ns = config.tick_ns.max(1);
        let model = SyntheticClockModel::new(config, LocalNs(host::realtime_ns()?));
        let info = SourceInfo {
            device: model.device_id(),
            kind: SourceKind::Synthetic,
            name: "synthetic clock model".into(),
            quantum_ns,
        };
        Ok(SyntheticSource { model, info })
    }

    pub fn model(&self) -> &SyntheticClockModel {
        &self.model
    }
}

fn shifted(stamp: HostStamp, by_ns: i64) -> HostStamp {
    HostStamp {
        realtime_ns: stamp.realtime_ns + by_ns,
        monotonic_ns: stamp.monotonic_ns + by_ns,
        boottime_ns: stamp.boottime_ns + by_ns,
    }
}

impl DeviceClockSource for SyntheticSource {
    fn info(&self) -> &SourceInfo {
        &self.info
    }

    fn sample_burst(
        &mut self,
        n: usize,
        burst: u64,
        first_seq: u64,
    ) -> Result<Vec<SnapshotPair>, DevClockError> {
        let mut pairs = Vec::with_capacity(n);
        for i in 0..n {
            let before = host::stamp_before()?;
            let (mut pair, _truth) = self.model.sample(LocalNs(before.realtime_ns), burst);
            // Keep the model's bracket width, but on the real host clocks.
            let width = pair.after.realtime_ns - pair.before.realtime_ns;
            pair.before = before;
            pair.after = shifted(before, width);
            pair.seq = first_seq + i as u64;
            pairs.push(pair);
        }
        Ok(pairs)
    }
}
