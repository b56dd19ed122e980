//! ROCm KFD source without AMD hardware: UAPI layouts, topology parsing on
//! fixture trees, and the "no AMD GPU" paths. The ioctl itself is exercised
//! only up to the kernel's refusal (on /dev/null); it has not run on an AMD
//! GPU yet.
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};

use clockmesh::devclock::DevClockError;
use clockmesh::devclock::DeviceClockSource;
use clockmesh::devclock::rocm::{
    AMDGPU_INFO_DEV_INFO, AMDKFD_IOC_GET_CLOCK_COUNTERS, DEV_INFO_GPU_COUNTER_FREQ_OFFSET,
    DRM_IOCTL_AMDGPU_INFO, DrmAmdgpuInfo, KfdGetClockCountersArgs, RocmKfdSource, RocmPaths,
    parse_topology,
};

/// A temporary directory removed on drop (no extra dev-dependency).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "clockmesh-devclock-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_node(nodes: &Path, name: &str, gpu_id: &str, properties: &str) {
    let dir = nodes.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("gpu_id"), gpu_id).unwrap();
    std::fs::write(dir.join("properties"), properties).unwrap();
}

#[test]
fn kfd_clock_counters_args_match_the_kernel_uapi() {
    // include/uapi/linux/kfd_ioctl.h: four __u64 then gpu_id, pad (__u32).
    assert_eq!(size_of::<KfdGetClockCountersArgs>(), 40);
    assert_eq!(align_of::<KfdGetClockCountersArgs>(), 8);
    assert_eq!(offset_of!(KfdGetClockCountersArgs, gpu_clock_counter), 0);
    assert_eq!(offset_of!(KfdGetClockCountersArgs, cpu_clock_counter), 8);
    assert_eq!(
        offset_of!(KfdGetClockCountersArgs, system_clock_counter),
        16
    );
    assert_eq!(offset_of!(KfdGetClockCountersArgs, system_clock_freq), 24);
    assert_eq!(offset_of!(KfdGetClockCountersArgs, gpu_id), 32);
    assert_eq!(offset_of!(KfdGetClockCountersArgs, pad), 36);
    // AMDKFD_IOWR(0x05, 40-byte struct), type 'K': _IOC(3, 'K', 5, 40).
    assert_eq!(AMDKFD_IOC_GET_CLOCK_COUNTERS, 0xC028_4B05);
}

#[test]
fn drm_amdgpu_info_matches_the_kernel_uapi() {
    // include/uapi/drm/amdgpu_drm.h: struct drm_amdgpu_info is 32 bytes;
    // DRM_IOW(0x40 + 0x05, ...) with type 'd'.
    assert_eq!(size_of::<DrmAmdgpuInfo>(), 32);
    assert_eq!(offset_of!(DrmAmdgpuInfo, return_size), 8);
    assert_eq!(offset_of!(DrmAmdgpuInfo, query), 12);
    assert_eq!(DRM_IOCTL_AMDGPU_INFO, 0x4020_6445);
    assert_eq!(AMDGPU_INFO_DEV_INFO, 0x16);
    // gpu_counter_freq follows device_id, chip_rev, external_rev, pci_rev,
    // family, num_shader_engines, num_shader_arrays_per_engine.
    assert_eq!(DEV_INFO_GPU_COUNTER_FREQ_OFFSET, 7 * 4);
}

#[test]
fn topology_lists_gpu_nodes_in_order_and_skips_cpus() {
    let tmp = TempDir::new("topo");
    let nodes = tmp.0.join("nodes");
    // Shapes copied from a KFD topology: node 0 is the CPU (gpu_id 0).
    write_node(&nodes, "0", "0\n", "cpu_cores_count 64\nsimd_count 0\n");
    write_node(
        &nodes,
        "2",
        "54321\n",
        "simd_count 304\nvendor_id 4098\ndevice_id 29856\nlocation_id 49920\ndomain 0\ndrm_render_minor 129\nunique_id 1234567890123456789\n",
    );
    write_node(
        &nodes,
        "1",
        "12345\n",
        "simd_count 304\nvendor_id 4098\ndevice_id 29856\nlocation_id 256\ndomain 1\ndrm_render_minor 128\n",
    );
    std::fs::create_dir_all(nodes.join("not-a-node")).unwrap();

    let gpus = parse_topology(&nodes).unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!((gpus[0].node, gpus[0].gpu_id), (1, 12345));
    assert_eq!((gpus[1].node, gpus[1].gpu_id), (2, 54321));
    assert_eq!(gpus[0].drm_render_minor, Some(128));
    assert_eq!(gpus[0].vendor_id, Some(0x1002));
    assert_eq!(gpus[1].unique_id, Some(1_234_567_890_123_456_789));
    assert_eq!(gpus[0].pci_bus_id().as_deref(), Some("0001:01:00.0"));
    assert_eq!(gpus[1].pci_bus_id().as_deref(), Some("0000:c3:00.0"));
}

#[test]
fn malformed_gpu_id_is_a_clear_error() {
    let tmp = TempDir::new("bad");
    let nodes = tmp.0.join("nodes");
    write_node(&nodes, "1", "twelve\n", "");
    let err = parse_topology(&nodes).unwrap_err();
    assert!(matches!(err, DevClockError::Topology { .. }), "{err}");
    assert!(err.to_string().contains("gpu_id"), "{err}");
}

#[test]
fn no_kfd_means_no_amd_gpu() {
    let tmp = TempDir::new("none");
    // No topology directory at all: the amdgpu/KFD driver is not loaded.
    assert!(parse_topology(&tmp.0.join("nodes")).unwrap().is_empty());
    let paths = RocmPaths {
        topology_nodes: tmp.0.join("nodes"),
        kfd: tmp.0.join("kfd"),
        dri: tmp.0.join("dri"),
    };
    let err = RocmKfdSource::open_at(&paths, 0, None).err().unwrap();
    assert!(err.is_unavailable(), "{err}");
    // Only CPU nodes: still no AMD GPU.
    write_node(&paths.topology_nodes, "0", "0", "");
    let err = RocmKfdSource::open_at(&paths, 0, None).err().unwrap();
    assert!(err.is_unavailable(), "{err}");
    // A GPU node but no /dev/kfd.
    write_node(&paths.topology_nodes, "1", "777", "drm_render_minor 128\n");
    let err = RocmKfdSource::open_at(&paths, 0, Some(100_000_000))
        .err()
        .unwrap();
    assert!(err.is_unavailable(), "{err}");
    // Asking for a device that is not there.
    let err = RocmKfdSource::open_at(&paths, 3, None).err().unwrap();
    assert!(
        matches!(
            err,
            DevClockError::NoSuchDevice {
                index: 3,
                available: 1
            }
        ),
        "{err}"
    );
}

#[test]
fn this_machine_without_amd_gpu_reports_unavailable() {
    if Path::new("/dev/kfd").exists() {
        eprintln!("SKIP: /dev/kfd exists here; this test covers machines without one");
        return;
    }
    let err = RocmKfdSource::open(0, None).err().unwrap();
    assert!(err.is_unavailable(), "{err}");
}

#[test]
fn ioctl_refused_by_a_non_kfd_file_is_an_error_not_a_panic() {
    let tmp = TempDir::new("devnull");
    let nodes = tmp.0.join("nodes");
    write_node(&nodes, "1", "777", "");
    let paths = RocmPaths {
        topology_nodes: nodes,
        kfd: "/dev/null".into(),
        dri: tmp.0.join("dri"),
    };
    // No drm_render_minor and no rate given: cannot know the tick rate.
    let err = RocmKfdSource::open_at(&paths, 0, None).err().unwrap();
    assert!(err.is_unavailable(), "{err}");
    let mut src = RocmKfdSource::open_at(&paths, 0, Some(100_000_000)).unwrap();
    assert_eq!(src.info().quantum_ns, 10);
    assert_eq!(src.node().gpu_id, 777);
    let err = src.sample_burst(4, 0, 0).unwrap_err();
    assert!(
        err.to_string().contains("AMDKFD_IOC_GET_CLOCK_COUNTERS"),
        "{err}"
    );
}
