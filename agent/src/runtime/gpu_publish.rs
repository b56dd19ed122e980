//! The agent's side of GPU clocks: picks up the sampling thread's maps
//! ([`super::gpu`]) and puts them in the offsets record, on `/status` and
//! in the JSONL history.

use tracing::warn;

use super::{driver::Agent, gpu::device_entry};
use crate::{
    discovery::{Coordination, Discovery},
    publish::{DeviceMap, Record, history::DeviceHistoryEntry, realtime_now_ns},
};

impl<D: Discovery + Coordination> Agent<D> {
    /// Picks up new GPU maps: status, offsets record, JSONL history.
    pub(super) fn poll_gpu(&mut self) {
        let Some(gpu) = &self.gpu else { return };
        if gpu.generation() == self.gpu_seen {
            return;
        }
        let snap = gpu.snapshot();
        self.gpu_seen = snap.generation;
        self.status_extra.devices = snap.devices;
        self.status_extra.gpu_error = snap.error;
        // Device maps reach the file with the node's first result: before
        // that a restarted agent's stale record stays as it is.
        if self.node.has_published() {
            let mut record = self.writer.current();
            record.devices = self.device_entries();
            record.updated_at_ns = self.local_now().0;
            self.publish_record(&record);
        }
        self.write_device_lines();
    }

    /// Device entries for the offsets file (at most 16 GPUs are sampled).
    pub(super) fn device_entries(&self) -> Vec<DeviceMap> {
        let skew = self.cfg.inject_skew.as_ref().map(|s| s.value);
        self.status_extra
            .devices
            .iter()
            .filter_map(|d| device_entry(d, skew))
            .collect()
    }

    pub(super) fn publish_record(&mut self, record: &Record) {
        if let Err(e) = self.writer.publish(record) {
            self.io.publish_errors += 1;
            warn!("publishing offsets: {e}");
        }
    }

    /// One `"type":"device"` line per GPU per window: maps cover the last
    /// 30 s, so lines a window apart overlap and `trace merge` can map any
    /// past device time.
    fn write_device_lines(&mut self) {
        let window = self.window_index(self.local_now());
        if self.device_lines_window == Some(window) {
            return;
        }
        let lines: Vec<DeviceHistoryEntry> = self
            .status_extra
            .devices
            .iter()
            .filter_map(|d| d.map.clone())
            .map(|map| DeviceHistoryEntry {
                kind: "device".into(),
                host: self.node.me().name.clone(),
                window: window as u64,
                written_at_ns: realtime_now_ns().0,
                map,
            })
            .collect();
        if lines.is_empty() {
            return;
        }
        self.device_lines_window = Some(window);
        for line in &lines {
            self.write_line(line);
        }
    }
}
