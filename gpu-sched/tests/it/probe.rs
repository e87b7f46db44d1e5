//! The real probes on this machine. No GPU is required: without a driver the NVML probe must
//! degrade to "no GPUs" with the reason; with one it must list them.

use std::os::unix::process::CommandExt;
use std::process::Command;

use knob_gpu_sched::probe::{
    process_group_of, HostProbe, LocalProbe, NvmlProbe, SimulatedInventory,
};
use knob_gpu_sched::{GpuProbeError, GpuSource};

#[test]
fn nvml_either_lists_gpus_or_says_why_not() {
    let mut probe = LocalProbe::with_simulation("local", None).unwrap();
    let environments = probe.sample(&|_| false);
    assert_eq!(environments.len(), 1);
    let local = &environments[0];
    assert_eq!(local.id.as_str(), "local");
    assert_eq!(local.host, "localhost");
    match NvmlProbe::init() {
        Ok(nvml) => {
            assert!(
                matches!(&local.gpu_source, GpuSource::Nvml { driver_version, .. } if driver_version == nvml.driver_version())
            );
            assert!(!local.gpus.is_empty(), "NVML started but listed no GPU");
            for gpu in &local.gpus {
                assert!(gpu.memory_total.bytes() > 0);
                assert!(gpu.memory_used.bytes() <= gpu.memory_total.bytes());
            }
        }
        Err(error) => {
            assert!(local.gpus.is_empty());
            assert_eq!(
                local.gpu_source,
                GpuSource::Unavailable {
                    reason: error.to_string()
                }
            );
            if error
                == (GpuProbeError::LibraryNotFound {
                    library: "libnvidia-ml.so.1".to_owned(),
                })
            {
                assert_eq!(
                    error.to_string(),
                    "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this machine"
                );
            }
        }
    }
}

#[test]
fn host_probe_reads_cpu_and_memory() {
    let mut probe = HostProbe::new().unwrap();
    let first = probe.sample();
    assert_eq!(
        first.cpu_utilization_percent, None,
        "one sample cannot give CPU use"
    );
    let expected_cpus = std::thread::available_parallelism().unwrap().get() as u32;
    assert_eq!(first.cpu_count, expected_cpus);
    assert!(first.memory_total.bytes() > 0);
    assert!(first.memory_available.bytes() <= first.memory_total.bytes());
    let second = probe.sample_blocking();
    let percent = second
        .cpu_utilization_percent
        .expect("two samples give CPU use");
    assert!((0.0..=100.0).contains(&percent), "{percent}");
}

#[test]
fn simulation_replaces_nvml_but_keeps_the_real_host() {
    let spec = SimulatedInventory::parse("4x80GiB").unwrap();
    let mut probe = LocalProbe::with_simulation("local", Some(spec)).unwrap();
    let environments = probe.sample(&|_| false);
    let local = &environments[0];
    assert_eq!(local.gpus.len(), 4);
    assert_eq!(
        local.gpu_source,
        GpuSource::Simulated {
            spec: "4x80GiB".to_owned()
        }
    );
    let real = HostProbe::new().unwrap().sample();
    assert_eq!(local.host_resources.cpu_count, real.cpu_count);
    assert_eq!(local.host_resources.memory_total, real.memory_total);
}

#[test]
fn the_environment_variable_selects_simulation_and_reports_bad_specs() {
    // The only test that touches KNOB_SIMULATE_GPUS.
    std::env::set_var("KNOB_SIMULATE_GPUS", "gpu1=2x24GiB;gpu2=1x48GiB");
    let environments = LocalProbe::new("local").unwrap().sample(&|_| false);
    let ids: Vec<&str> = environments.iter().map(|env| env.id.as_str()).collect();
    assert_eq!(ids, ["gpu1", "gpu2"]);
    std::env::set_var("KNOB_SIMULATE_GPUS", "4 GPUs please");
    let error = LocalProbe::new("local").unwrap_err().to_string();
    std::env::remove_var("KNOB_SIMULATE_GPUS");
    assert!(
        error.starts_with("KNOB_SIMULATE_GPUS: cannot read simulated GPU spec `4 GPUs please`"),
        "{error}"
    );
}

#[test]
fn process_groups_tell_trials_from_foreign_processes() {
    let mut child = Command::new("sleep")
        .arg("5")
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = child.id();
    let group = process_group_of(pid);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        group,
        Some(pid),
        "a process started with process_group(0) leads its group"
    );

    let ours = process_group_of(std::process::id()).unwrap();
    let ps = Command::new("ps")
        .args(["-o", "pgid=", "-p", &std::process::id().to_string()])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&ps.stdout).trim(), ours.to_string());
    assert_eq!(process_group_of(0x7fff_fff0), None);
}

#[test]
fn process_group_survives_odd_command_names() {
    // /proc/<pid>/stat puts the command name in parentheses without escaping: a name holding
    // ") 1 2 3" must not shift the fields.
    let dir = std::env::temp_dir().join(format!("knob-pgid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let odd = dir.join(") 1 2 3 (x");
    std::os::unix::fs::symlink("/bin/sleep", &odd).unwrap();
    let mut child = Command::new(&odd)
        .arg("5")
        .process_group(0)
        .spawn()
        .unwrap();
    let group = process_group_of(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(group, Some(child.id()));
}
