//! The limits of a machine that other people use too (knob extension, after FedFlow's group
//! scheduler): `maxCpuUtilization`, `maxMemoryUtilization`, `memoryReserve`,
//! `maxGpuMemoryUtilization` and `gpuMemoryReserve`. Every service reads them the same way, for
//! each of its environments (the local machine, each remote machine, the Slurm allocations),
//! each defaulting to the experiment's top-level field of the same name; gpu-sched enforces them
//! (`knob_gpu_sched::EnvironmentLimits`).
//!
//! Canonical form: percentages as numbers, sizes as whole MiB; a limit not set is left out (so
//! configs that use none read back as before).

use knob_gpu_sched::{ByteSize, EnvironmentLimits};
use knob_plugin_api::config::{self, normalize_key, ConfigReader, Fields};
use serde_json::{Map, Value};

/// The config names, as a service's field list and the canonical keys.
pub const LIMIT_FIELDS: [&str; 5] = [
    "maxCpuUtilization",
    "maxMemoryUtilization",
    "memoryReserve",
    "maxGpuMemoryUtilization",
    "gpuMemoryReserve",
];

fn is_size(name: &str) -> bool {
    name.ends_with("Reserve")
}

/// Reads the limits from one environment's mapping into `canonical`, each defaulting to the
/// top-level shortcut the user wrote (which the core has checked and made canonical); a limit
/// set nowhere is left out.
pub fn read(
    reader: &mut ConfigReader<'_>,
    fields: &mut Fields<'_>,
    canonical: &mut Map<String, Value>,
) {
    for name in LIMIT_FIELDS {
        let written = fields.take(name).and_then(|field| {
            if is_size(name) {
                reader.size_mib(&field).map(Value::from)
            } else {
                reader.percent(&field).map(Value::from)
            }
        });
        let value = written.or_else(|| {
            reader
                .context
                .shortcuts
                .get(name)
                .filter(|value| !value.is_null())
                .cloned()
        });
        if let Some(value) = value {
            canonical.insert(name.into(), value);
        }
    }
}

/// Sets the limit a class-args key names (`normalized` as by [`normalize_key`]). `Ok(false)`
/// when the key is not a limit; `Err` says what the value must be.
pub fn set(limits: &mut EnvironmentLimits, key: &str, value: &Value) -> Result<bool, String> {
    let normalized = normalize_key(key);
    let Some(name) = LIMIT_FIELDS
        .iter()
        .find(|name| normalize_key(name) == normalized)
    else {
        return Ok(false);
    };
    let bad = |e: String| format!("{key}: {e}");
    if value.is_null() {
        match *name {
            "maxCpuUtilization" => limits.max_cpu_utilization = None,
            "maxMemoryUtilization" => limits.max_memory_utilization = None,
            "memoryReserve" => limits.min_available_memory = None,
            "maxGpuMemoryUtilization" => limits.max_gpu_memory_utilization = None,
            _ => limits.gpu_memory_reserve = None,
        }
        return Ok(true);
    }
    if is_size(name) {
        let size = ByteSize(config::size_mib(value).map_err(bad)? * 1024 * 1024);
        match *name {
            "memoryReserve" => limits.min_available_memory = Some(size),
            _ => limits.gpu_memory_reserve = Some(size),
        }
    } else {
        let percent = config::percent(value).map_err(bad)? as f32;
        match *name {
            "maxCpuUtilization" => limits.max_cpu_utilization = Some(percent),
            "maxMemoryUtilization" => limits.max_memory_utilization = Some(percent),
            _ => limits.max_gpu_memory_utilization = Some(percent),
        }
    }
    Ok(true)
}

/// Copies the shared-machine limits of `from` onto `to`, leaving its other limits.
pub fn copy(from: &EnvironmentLimits, to: &mut EnvironmentLimits) {
    to.max_cpu_utilization = from.max_cpu_utilization;
    to.max_memory_utilization = from.max_memory_utilization;
    to.min_available_memory = from.min_available_memory;
    to.max_gpu_memory_utilization = from.max_gpu_memory_utilization;
    to.gpu_memory_reserve = from.gpu_memory_reserve;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn class_args_set_each_limit_and_refuse_bad_values() {
        let mut limits = EnvironmentLimits::default();
        for (key, value) in [
            ("maxCpuUtilization", json!(90)),
            ("max_memory_utilization", json!("80%")),
            ("memoryReserve", json!(2048)),
            ("maxGpuMemoryUtilization", json!(75.5)),
            ("gpuMemoryReserve", json!("1GiB")),
        ] {
            assert_eq!(set(&mut limits, key, &value), Ok(true), "{key}");
        }
        assert_eq!(limits.max_cpu_utilization, Some(90.0));
        assert_eq!(limits.max_memory_utilization, Some(80.0));
        assert_eq!(limits.min_available_memory, Some(ByteSize::gib(2)));
        assert_eq!(limits.max_gpu_memory_utilization, Some(75.5));
        assert_eq!(limits.gpu_memory_reserve, Some(ByteSize::gib(1)));
        assert_eq!(set(&mut limits, "useActiveGpu", &json!(true)), Ok(false));
        assert_eq!(
            set(&mut limits, "maxCpuUtilization", &json!(0)),
            Err("maxCpuUtilization: expected a percentage above 0 and at most 100, like 90 or \"90%\", got 0".into())
        );
        assert!(set(&mut limits, "gpuMemoryReserve", &json!("lots")).is_err());
    }
}
