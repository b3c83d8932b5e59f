//! A link of the calling thread's network namespace looked up by name through ioctls, not
//! rtnetlink. The kernel answers RTM_GETLINK for a veth with the id of its peer's namespace,
//! which it finds by walking every namespace id the node holds (`peernet2id`): one per pod, so
//! each lookup of a host veth cost more the more pods the node had. SIOCGIFINDEX and
//! SIOCGIFHWADDR read the device alone.
use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use super::netlink::Link;

/// The link named `name` here, or None when there is none.
pub fn by_name(name: &str) -> io::Result<Option<Link>> {
    let mut request = request(name)?;
    // SAFETY: a plain socket call; the descriptor is owned right after.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor this call just opened and nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    let ask = |request: &mut libc::ifreq, what: libc::Ioctl| {
        // SAFETY: both ioctls read the name and write only within the `ifreq` they are given.
        match unsafe { libc::ioctl(socket.as_raw_fd(), what, request as *mut libc::ifreq) } {
            0 => Ok(true),
            _ => match io::Error::last_os_error() {
                e if e.raw_os_error() == Some(libc::ENODEV) => Ok(false),
                e => Err(e),
            },
        }
    };
    if !ask(&mut request, libc::SIOCGIFINDEX)? {
        return Ok(None);
    }
    // SAFETY: SIOCGIFINDEX filled the union's index.
    let index = unsafe { request.ifr_ifru.ifru_ifindex };
    if !ask(&mut request, libc::SIOCGIFHWADDR)? {
        return Ok(None);
    }
    // SAFETY: SIOCGIFHWADDR filled the union's hardware address.
    let data = unsafe { request.ifr_ifru.ifru_hwaddr.sa_data };
    let mut mac = [0u8; 6];
    for (byte, value) in mac.iter_mut().zip(data) {
        *byte = value as u8;
    }
    Ok(Some(Link { index: index as u32, mac }))
}

fn request(name: &str) -> io::Result<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} is not an interface name")));
    }
    // SAFETY: an all-zero `ifreq` is a valid value (an empty name, a zeroed union).
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(bytes) {
        *slot = *byte as libc::c_char;
    }
    Ok(request)
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_is_found_and_a_missing_name_is_none() {
        let lo = super::by_name("lo").unwrap().expect("every namespace has lo");
        assert!(lo.index > 0);
        assert_eq!(lo.mac, [0; 6]);
        assert!(super::by_name("ecni-no-such0").unwrap().is_none());
        assert!(super::by_name("").is_err());
        assert!(super::by_name("a-name-longer-than-ifnamsiz").is_err());
    }
}
