//! Rotary position embeddings as Hugging Face's Llama and Qwen3 apply them:
//! each head's vector is split in halves that rotate as pairs
//! (`rotate_half`), with the inverse frequencies of `rope_theta`, adjusted
//! by the checkpoint's `rope_scaling`. Written with plain tensor ops so the
//! trainer differentiates through it.

use candle_core::{D, Device, Tensor};

use super::config::{DecoderArch, RopeScaling};
use crate::error::ModelError;

/// cos and sin of every position's angles, [context, head_dim] each (the
/// half-width angles repeated, as `rotate_half` needs).
#[derive(Clone, Debug)]
pub struct RopeTables {
    pub cos: Tensor,
    pub sin: Tensor,
}

/// θ_i = 1 / theta^(2i/d), then the checkpoint's scaling.
pub fn inverse_frequencies(a: &DecoderArch) -> Vec<f64> {
    let d = a.head_dim;
    let base: Vec<f64> = (0..d / 2)
        .map(|i| 1.0 / a.rope_theta.powf((2 * i) as f64 / d as f64))
        .collect();
    match &a.rope_scaling {
        None => base,
        Some(RopeScaling::Linear { factor }) => base.iter().map(|f| f / factor).collect(),
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => {
            let old = *original_max_position_embeddings as f64;
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

/// cos and sin of the angles of positions `0..len`, [len, head_dim]
/// each, row-major.
pub fn angles(a: &DecoderArch, len: usize) -> (Vec<f32>, Vec<f32>) {
    let inv = inverse_frequencies(a);
    let d = a.head_dim;
    let mut cos = Vec::with_capacity(len * d);
    let mut sin = Vec::with_capacity(len * d);
    for p in 0..len {
        // Hugging Face computes the angles in f32; so does this.
        let angles: Vec<f32> = inv.iter().map(|&f| p as f32 * f as f32).collect();
        for _ in 0..2 {
            cos.extend(angles.iter().map(|x| x.cos()));
            sin.extend(angles.iter().map(|x| x.sin()));
        }
    }
    (cos, sin)
}

impl RopeTables {
    pub fn new(a: &DecoderArch, context: usize) -> Result<Self, ModelError> {
        let (cos, sin) = angles(a, context);
        let d = a.head_dim;
        Ok(RopeTables {
            cos: Tensor::from_vec(cos, (context, d), &Device::Cpu)?,
            sin: Tensor::from_vec(sin, (context, d), &Device::Cpu)?,
        })
    }
}

/// x · cos + rotate_half(x) · sin, with `cos`/`sin` broadcastable to `x`.
pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, ModelError> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rot = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    Ok((x.broadcast_mul(cos)? + rot.broadcast_mul(sin)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Family;

    fn arch(scaling: Option<RopeScaling>) -> DecoderArch {
        DecoderArch {
            family: Family::Llama,
            kv_heads: 1,
            head_dim: 8,
            rope_theta: 500_000.0,
            rope_scaling: scaling,
            norm_eps: 1e-5,
            tie_embeddings: true,
            attention_bias: false,
        }
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let plain = inverse_frequencies(&arch(None));
        let scaled = inverse_frequencies(&arch(Some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        })));
        assert_eq!(plain[0], scaled[0]);
        let last = plain.len() - 1;
        assert!((scaled[last] - plain[last] / 8.0).abs() < 1e-15);
    }

    #[test]
    fn rotation_keeps_the_norm_and_position_zero_is_identity() {
        let t = RopeTables::new(&arch(None), 4).unwrap();
        let x = Tensor::from_vec(
            (0..16).map(|i| i as f32 - 7.5).collect(),
            (2, 8),
            &Device::Cpu,
        )
        .unwrap();
        let y = apply(
            &x,
            &t.cos.narrow(0, 0, 2).unwrap(),
            &t.sin.narrow(0, 0, 2).unwrap(),
        )
        .unwrap();
        let (x, y) = (x.to_vec2::<f32>().unwrap(), y.to_vec2::<f32>().unwrap());
        assert_eq!(x[0], y[0]);
        let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((n(&x[1]) - n(&y[1])).abs() < 1e-3);
        assert_ne!(x[1], y[1]);
    }
}
