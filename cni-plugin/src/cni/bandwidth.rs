//! The `bandwidth` capability: `runtimeConfig.bandwidth` as kubelet fills it from a pod's
//! `kubernetes.io/ingress-bandwidth` and `egress-bandwidth` annotations and as the reference
//! `bandwidth` plugin reads it: `ingressRate`/`egressRate` in bits per second,
//! `ingressBurst`/`egressBurst` in bits. Ingress is what the pod receives, egress what it sends.
use serde_json::Value;

use super::{CniError, CniResult, ErrorCode};

/// The largest burst a TBF qdisc holds: its size in bytes is a 32-bit number.
const MAX_BURST_BYTES: u64 = u32::MAX as u64;

/// One direction's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// Bits per second.
    pub rate: u64,
    /// Bits the pod may send or receive at once above the rate.
    pub burst: u64,
}

impl Limit {
    pub fn rate_bytes(self) -> u64 {
        self.rate / 8
    }

    pub fn burst_bytes(self) -> u32 {
        (self.burst / 8) as u32
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bandwidth {
    pub ingress: Option<Limit>,
    pub egress: Option<Limit>,
}

impl Bandwidth {
    /// Reads `runtimeConfig.bandwidth` (absent: no limit). A direction is limited when it has
    /// both a rate and a burst; one without the other is an error, as with the reference plugin.
    /// A burst must hold one full frame at `mtu`, or the qdisc would pass nothing at all.
    pub fn parse(value: Option<&Value>, mtu: u32) -> CniResult<Self> {
        let Some(value) = value else { return Ok(Self::default()) };
        let object = value.as_object().ok_or_else(|| bad("runtimeConfig.bandwidth must be an object"))?;
        let field = |name: &str| -> CniResult<u64> {
            match object.get(name) {
                None | Some(Value::Null) => Ok(0),
                Some(v) => {
                    v.as_u64().ok_or_else(|| bad(format!("bandwidth {name} must be a whole number ≥ 0, not {v}")))
                }
            }
        };
        let direction = |name: &str| -> CniResult<Option<Limit>> {
            let (rate, burst) = (field(&format!("{name}Rate"))?, field(&format!("{name}Burst"))?);
            match (rate, burst) {
                (0, 0) => Ok(None),
                (_, 0) => Err(bad(format!("bandwidth {name}Rate is set without {name}Burst"))),
                (0, _) => Err(bad(format!("bandwidth {name}Burst is set without {name}Rate"))),
                _ => limit(name, rate, burst, mtu).map(Some),
            }
        };
        Ok(Self { ingress: direction("ingress")?, egress: direction("egress")? })
    }
}

fn limit(name: &str, rate: u64, burst: u64, mtu: u32) -> CniResult<Limit> {
    if rate < 8 {
        return Err(bad(format!("bandwidth {name}Rate {rate} is below one byte per second")));
    }
    if burst / 8 > MAX_BURST_BYTES {
        return Err(bad(format!("bandwidth {name}Burst {burst} is above 4 GiB")));
    }
    // An Ethernet header on top of the MTU: the largest frame the veth carries.
    let frame = u64::from(mtu) + 14;
    if burst / 8 < frame {
        return Err(bad(format!(
            "bandwidth {name}Burst {burst} bits is less than one {frame}-byte frame at MTU {mtu}: nothing would pass"
        )));
    }
    Ok(Limit { rate, burst })
}

fn bad(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::INVALID_CONFIG, msg)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_both_directions_in_bits() {
        let value = json!({ "ingressRate": 20_000_000, "ingressBurst": 400_000, "egressRate": 10_000_000, "egressBurst": 200_000 });
        let bw = Bandwidth::parse(Some(&value), 1500).unwrap();
        assert_eq!(bw.ingress, Some(Limit { rate: 20_000_000, burst: 400_000 }));
        assert_eq!(bw.egress.unwrap().rate_bytes(), 1_250_000);
        assert_eq!(bw.egress.unwrap().burst_bytes(), 25_000);
        assert_eq!(Bandwidth::parse(None, 1500).unwrap(), Bandwidth::default());
        let zero = json!({ "ingressRate": 0, "ingressBurst": 0 });
        assert_eq!(Bandwidth::parse(Some(&zero), 1500).unwrap(), Bandwidth::default());
    }

    #[test]
    fn refuses_what_no_qdisc_could_serve() {
        for value in [
            json!({ "ingressRate": 1_000_000 }),
            json!({ "egressBurst": 100_000 }),
            json!({ "ingressRate": -1, "ingressBurst": 100_000 }),
            json!({ "ingressRate": "1M", "ingressBurst": 100_000 }),
            json!({ "egressRate": 1_000_000, "egressBurst": 8_000 }),
            json!({ "egressRate": 1_000_000, "egressBurst": 8 * (u64::from(u32::MAX) + 1) }),
            json!("fast"),
        ] {
            let err = Bandwidth::parse(Some(&value), 1500).unwrap_err();
            assert_eq!(err.code, ErrorCode::INVALID_CONFIG, "{value}");
        }
    }
}
