//! Drives one source and its fitter: one call, one burst.
use clockmesh_estimator::device::{
    BurstOutcome, DeviceClockFit, DeviceClockFitter, FitConfig, FitStats,
};

use super::{DevClockError, DeviceClockSource, PublishedDeviceMap, SnapshotPair};

/// Sampler settings.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Pairs per burst; the fitter keeps the tightest.
    pub burst_len: usize,
    pub fit: FitConfig,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            burst_len: 8,
            fit: FitConfig::default(),
        }
    }
}

/// One burst and what the fitter made of it.
#[derive(Debug, Clone)]
pub struct BurstSample {
    pub pairs: Vec<SnapshotPair>,
    pub outcome: BurstOutcome,
    /// The fit as it was before this burst (for predicted-vs-measured).
    pub prior_fit: Option<DeviceClockFit>,
}

pub struct DeviceClockSampler {
    source: Box<dyn DeviceClockSource>,
    fitter: DeviceClockFitter,
    burst_len: usize,
    next_burst: u64,
    next_seq: u64,
}

impl DeviceClockSampler {
    pub fn new(
        source: Box<dyn DeviceClockSource>,
        config: SamplerConfig,
    ) -> Result<Self, DevClockError> {
        let info = source.info();
        let fitter = DeviceClockFitter::new(info.device, info.kind, config.fit)?;
        Ok(DeviceClockSampler {
            source,
            fitter,
            burst_len: config.burst_len.max(1),
            next_burst: 0,
            next_seq: 0,
        })
    }

    /// Take one burst and feed it to the fitter.
    pub fn sample(&mut self) -> Result<BurstSample, DevClockError> {
        let burst = self.next_burst;
        self.next_burst += 1;
        let pairs = self
            .source
            .sample_burst(self.burst_len, burst, self.next_seq)?;
        self.next_seq += pairs.len() as u64;
        let prior_fit = self.fitter.fit().cloned();
        let outcome = self.fitter.push_burst(&pairs)?;
        Ok(BurstSample {
            pairs,
            outcome,
            prior_fit,
        })
    }

    pub fn fit(&self) -> Option<&DeviceClockFit> {
        self.fitter.fit()
    }

    pub fn stats(&self) -> FitStats {
        self.fitter.stats()
    }

    pub fn fitter(&self) -> &DeviceClockFitter {
        &self.fitter
    }

    pub fn source(&self) -> &dyn DeviceClockSource {
        self.source.as_ref()
    }

    /// The current map in publishable form, if there is a fit.
    pub fn published(&self) -> Option<PublishedDeviceMap> {
        self.fitter.fit().map(super::published_map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devclock::synthetic::SyntheticSource;
    use clockmesh_estimator::device::SyntheticConfig;

    #[test]
    fn synthetic_source_end_to_end_on_real_host_clock() {
        let source = SyntheticSource::new(SyntheticConfig::default()).unwrap();
        let mut s = DeviceClockSampler::new(Box::new(source), SamplerConfig::default()).unwrap();
        for _ in 0..50 {
            let b = s.sample().unwrap();
            assert_eq!(b.pairs.len(), 8);
            assert!(b.outcome.accepted.is_some());
        }
        let fit = s.fit().unwrap();
        // Back-to-back bursts span little time, so only a loose check of the
        // 21.7 ppm drift; the estimator's tests check accuracy properly.
        assert_eq!(fit.points, 50);
        let published = s.published().unwrap();
        assert_eq!(published.source, "synthetic");
        assert_eq!(s.stats().accepted, 50);
    }
}
