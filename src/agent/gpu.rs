//! The GPU half of a reading: per-GPU memory and utilisation from NVML.
//!
//! With the `nvml` feature, NVML is loaded once at start (nvml-wrapper opens
//! `libnvidia-ml.so.1`, or the given library, at run time). When that fails
//! — no driver, no GPU — the agent logs one warning and serves the engine
//! reading without GPUs; without the feature it logs that once at info.
//! Invariant: reading the GPUs never fails a reading; a device NVML cannot
//! read is left out, with a debug log.

use std::path::Path;

use crate::poller::dialect::AgentGpu;

/// This node's GPUs, or nothing to read.
#[derive(Clone, Debug)]
pub(super) struct Gpus {
    /// Reported instead of NVML's (`--simulate-gpus`).
    simulated: Option<Vec<AgentGpu>>,
    #[cfg(feature = "nvml")]
    nvml: Option<std::sync::Arc<nvml_wrapper::Nvml>>,
}

impl Gpus {
    /// Reports `gpus` at every reading, never loading NVML.
    pub(super) fn simulated(gpus: Vec<AgentGpu>) -> Self {
        tracing::info!(gpus = gpus.len(), "reporting simulated GPUs");
        Gpus {
            simulated: Some(gpus),
            #[cfg(feature = "nvml")]
            nvml: None,
        }
    }

    /// Loads NVML (from `lib` when given), logging once what is available.
    #[cfg(feature = "nvml")]
    pub(super) fn open(lib: Option<&Path>) -> Self {
        let init = match lib {
            Some(path) => nvml_wrapper::Nvml::builder()
                .lib_path(path.as_os_str())
                .init(),
            None => nvml_wrapper::Nvml::init(),
        };
        match init {
            Ok(nvml) => {
                match nvml.device_count() {
                    Ok(count) => tracing::info!(gpus = count, "NVML ready"),
                    Err(e) => tracing::warn!(error = %e, "NVML ready, but counting GPUs failed"),
                }
                Gpus {
                    simulated: None,
                    nvml: Some(std::sync::Arc::new(nvml)),
                }
            }
            Err(e) => {
                tracing::warn!(
                    nvml_lib = lib.map(|p| p.display().to_string()),
                    "NVML unavailable ({e}); serving the engine reading only"
                );
                Gpus {
                    simulated: None,
                    nvml: None,
                }
            }
        }
    }

    /// Without the `nvml` feature there is nothing to load.
    #[cfg(not(feature = "nvml"))]
    pub(super) fn open(lib: Option<&Path>) -> Self {
        tracing::info!(
            nvml_lib = lib.map(|p| p.display().to_string()),
            "built without the `nvml` feature; serving the engine reading only"
        );
        Gpus { simulated: None }
    }

    /// Every GPU NVML can read now, in index order; empty without NVML.
    #[cfg(feature = "nvml")]
    pub(super) async fn read(&self) -> Vec<AgentGpu> {
        if let Some(gpus) = &self.simulated {
            return gpus.clone();
        }
        let Some(nvml) = self.nvml.clone() else {
            return Vec::new();
        };
        // NVML calls block in the driver; keep them off the async workers.
        // The blocking task is awaited here, so this call owns it.
        match tokio::task::spawn_blocking(move || read_all(&nvml)).await {
            Ok(gpus) => gpus,
            Err(e) => {
                tracing::debug!(error = %e, "reading GPUs failed");
                Vec::new()
            }
        }
    }

    /// Without the `nvml` feature there are no GPUs to read, unless
    /// simulated.
    #[cfg(not(feature = "nvml"))]
    pub(super) async fn read(&self) -> Vec<AgentGpu> {
        self.simulated.clone().unwrap_or_default()
    }
}

#[cfg(feature = "nvml")]
fn read_all(nvml: &nvml_wrapper::Nvml) -> Vec<AgentGpu> {
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            tracing::debug!(error = %e, "counting GPUs failed");
            return Vec::new();
        }
    };
    (0..count)
        .filter_map(|index| match read_one(nvml, index) {
            Ok(gpu) => Some(gpu),
            Err(e) => {
                tracing::debug!(index, error = %e, "skipping a GPU NVML cannot read");
                None
            }
        })
        .collect()
}

#[cfg(feature = "nvml")]
fn read_one(
    nvml: &nvml_wrapper::Nvml,
    index: u32,
) -> Result<AgentGpu, nvml_wrapper::error::NvmlError> {
    let device = nvml.device_by_index(index)?;
    let memory = device.memory_info()?;
    let utilization = device.utilization_rates()?;
    Ok(AgentGpu {
        index,
        name: device.name()?,
        memory_used_bytes: memory.used,
        memory_total_bytes: memory.total,
        // NVML reports percent of the last sample period.
        utilization: f64::from(utilization.gpu.min(100)) / 100.0,
    })
}
