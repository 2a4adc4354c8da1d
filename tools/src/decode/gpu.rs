//! The GPU backend: the engine's decode step (`engine::step::Engine`), one CUDA graph replayed
//! per token after a first eager step (or every step eager with --eager), the greedy token chosen
//! on the device by the lm_head.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use engine::cuda::Gpu;
use engine::layers::sample::SampleParams;
use engine::model::config::ModelConfig;
use engine::model::weights::ModelWeights;
use engine::step::{Engine, Formats, ModelOnDevice, Profile, StepPlan};

use super::backend::Backend;
use super::error::{Result, fail};
use super::sampler::Sampler;

/// The engine, and what the run asked of it.
pub struct GpuBackend {
    engine: Engine,
    /// The greedy token of the last step; None before the first.
    next: Option<u32>,
    eager: bool,
    /// With --profile: every step eager, its stages timed and summed here.
    profile: Option<Profile>,
    profiled_steps: usize,
    /// The device sampler's parameters; None: greedy.
    sampling: Option<SampleParams>,
}

impl std::fmt::Debug for GpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBackend").field("engine", &self.engine).field("eager", &self.eager).finish()
    }
}

/// Progress on stderr: a rewritten line on a terminal, the last state otherwise.
fn progress_printer(what: &'static str) -> impl FnMut(&str, usize, usize) {
    let tty = std::io::stderr().is_terminal();
    move |part: &str, done: usize, total: usize| {
        if tty {
            eprint!("\r{what}: {part} {done}/{total}   ");
            let _ = std::io::stderr().flush();
            if done == total {
                eprintln!();
            }
        } else if done == total {
            eprintln!("{what}: {part} {done}/{total}");
        }
    }
}

impl GpuBackend {
    /// The engine for `weights` (a checkpoint read on the host) in `formats`.
    pub fn from_weights(gpu: Gpu, weights: &ModelWeights, formats: Formats, context: usize) -> Result<GpuBackend> {
        let plan = StepPlan::for_device(&weights.config, formats, context, gpu.info())?;
        let start = Instant::now();
        let mut show = progress_printer("uploading");
        let model = ModelOnDevice::upload(&gpu, weights, &plan, &mut |done, total| show("layer", done, total))?;
        eprintln!("uploaded to the device in {:.2} s", start.elapsed().as_secs_f64());
        GpuBackend::new(gpu, plan, model)
    }

    /// The engine for random weights of `cfg` made on the device from `seed` (NVFP4 where a
    /// kernel takes it, the n-gram table in pinned host memory).
    pub fn synthetic(gpu: Gpu, cfg: &ModelConfig, context: usize, seed: u64) -> Result<GpuBackend> {
        let plan = StepPlan::for_device(cfg, Formats::NVFP4, context, gpu.info())?;
        let start = Instant::now();
        let mut show = progress_printer("making synthetic weights");
        let model = ModelOnDevice::synthetic(&gpu, cfg, &plan, seed, &mut show)?;
        eprintln!("made the synthetic model in {:.2} s", start.elapsed().as_secs_f64());
        GpuBackend::new(gpu, plan, model)
    }

    fn new(gpu: Gpu, plan: StepPlan, model: ModelOnDevice) -> Result<GpuBackend> {
        let engine = Engine::new(gpu, plan, model)?;
        eprintln!(
            "step: {} launches per token, {:.1} MB to move per token at position 0",
            engine.launches_per_token(),
            engine.bytes_per_token(0) as f64 / 1e6
        );
        Ok(GpuBackend { engine, next: None, eager: false, profile: None, profiled_steps: 0, sampling: None })
    }

    /// Samples on the device after every step with `sampler`'s temperature, top-p and seed (its
    /// uniform drawn from the seed and the position of the token decoded: a stream of its own, not
    /// the host sampler's); greedy is the lm_head's own choice.
    pub fn set_sampling(&mut self, sampler: &Sampler) -> Result<()> {
        self.sampling = match *sampler {
            Sampler::Greedy => None,
            Sampler::TopP { temperature, top_p, seed } => {
                Some(SampleParams { temperature: temperature as f32, top_p: top_p as f32, seed })
            }
        };
        self.engine.set_sampling(self.sampling)?;
        Ok(())
    }

    /// Every step eager (no graph).
    pub fn set_eager(&mut self, eager: bool) {
        self.eager = eager;
        if eager {
            self.engine.release_graph();
        }
    }

    /// Every step eager with its stages timed ([`GpuBackend::profile`] sums them).
    pub fn set_profile(&mut self, on: bool) {
        self.profile = on.then(Profile::default);
        if on {
            self.set_eager(true);
        }
    }

    /// The stages' device time summed over the profiled steps, and the steps.
    pub fn profile(&self) -> Option<(&Profile, usize)> {
        self.profile.as_ref().map(|p| (p, self.profiled_steps))
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> String {
        let mode = if self.profile.is_some() {
            "eager launches, profiled"
        } else if self.eager {
            "eager launches"
        } else {
            "one CUDA graph per token"
        };
        format!("GPU engine on {} ({mode})", self.engine.gpu().info().name)
    }

    fn vocab(&self) -> usize {
        self.engine.vocab()
    }

    fn reset(&mut self) -> Result<()> {
        self.engine.reset()?;
        self.next = None;
        Ok(())
    }

    fn step(&mut self, token: u32) -> Result<()> {
        let next = match &mut self.profile {
            Some(total) => {
                let (next, p) = self.engine.step_profiled(token)?;
                for (stage, t, n) in p.stages {
                    match total.stages.iter_mut().find(|(s, ..)| *s == stage) {
                        Some((_, tt, nn)) => {
                            *tt += t;
                            *nn += n;
                        }
                        None => total.stages.push((stage, t, n)),
                    }
                }
                self.profiled_steps += 1;
                next
            }
            None => {
                let next = self.engine.step(token)?;
                // The first step ran the launches eagerly and loaded every module: capture now.
                if !self.eager && !self.engine.is_captured() {
                    self.engine.capture()?;
                }
                next
            }
        };
        self.next = Some(next);
        Ok(())
    }

    fn logits(&mut self) -> Result<Vec<f32>> {
        if self.next.is_none() {
            return fail("no logits yet: the backend has decoded no token since its reset");
        }
        Ok(self.engine.logits()?)
    }

    fn greedy(&mut self) -> Result<u32> {
        match self.next {
            Some(t) => Ok(t),
            None => fail("no token yet: the backend has decoded no token since its reset"),
        }
    }

    fn bytes_per_token(&self) -> Option<u64> {
        Some(self.engine.bytes_per_token(self.engine.position()) as u64)
    }

    /// The device's draw when the engine samples with these parameters ([`GpuBackend::set_sampling`]),
    /// else the host's from the logits.
    fn sample(&mut self, sampler: &Sampler, position: u64) -> Result<u32> {
        match (sampler, self.sampling) {
            (Sampler::TopP { temperature, top_p, seed }, Some(p))
                if p == (SampleParams { temperature: *temperature as f32, top_p: *top_p as f32, seed: *seed }) =>
            {
                self.greedy()
            }
            _ => sampler.sample(&self.logits()?, position),
        }
    }
}
