//! The control plane's side of `NAT`: forgetting a pod's masqueraded flows when it goes.
use aya::maps::{HashMap, Map, MapData};
use ebpf_common::{NatEntry, NatKey, names};

use super::datapath::Datapath;
use crate::cni::{CniResult, Context, ErrorCode};

impl Datapath {
    /// Removes both entries of every flow `owner`'s pod had, so that a late reply finds no
    /// translation (and never reaches the next pod given the same address). Returns how many.
    pub fn remove_nat(&self, owner: u64) -> CniResult<usize> {
        self.remove_nat_where(|o| o == owner)
    }

    /// Removes both entries of every flow whose owner `stale` picks; returns how many.
    pub fn remove_nat_where(&self, stale: impl Fn(u64) -> bool) -> CniResult<usize> {
        let path = self.pins.map(names::NAT);
        if !path.exists() {
            return Ok(0);
        }
        let data = MapData::from_pin(&path).cni(ErrorCode::DATAPATH, "cannot open pinned NAT")?;
        let map = Map::from_map_data(data).cni(ErrorCode::DATAPATH, "cannot open pinned NAT")?;
        let mut map: HashMap<_, NatKey, NatEntry> =
            HashMap::try_from(map).cni(ErrorCode::DATAPATH, "pinned NAT has another layout")?;
        let keys: Vec<NatKey> =
            map.iter().filter_map(Result::ok).filter(|(_, entry)| stale(entry.owner)).map(|(k, _)| k).collect();
        // An entry the LRU evicted meanwhile is already gone: not an error.
        let removed = keys.iter().filter(|key| map.remove(key).is_ok()).count();
        Ok(removed)
    }
}
