//! The URLs a file names: a remote service's (https, or plain http to loopback; never
//! link-local), a secret's host, and a queue agent's SQS queue URL.

use crate::domain::reply_to::QueueId;

/// The remote service gets the order: https only, so it cannot be read or altered on the
/// way, except to a loopback host (local runs, `sasctl dev`'s simulated service). Never a
/// link-local address (169.254.0.0/16, fe80::/10, AWS's fd00:ec2::/32): that is where a
/// host's instance metadata and container credentials are served, never a business service.
pub fn remote_url_allowed(value: &str) -> bool {
    url::Url::parse(value).is_ok_and(|u| {
        !is_link_local(&u)
            && match u.scheme() {
                "https" => u.has_host(),
                "http" => match u.host() {
                    Some(url::Host::Domain(d)) => d == "localhost",
                    Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                    Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                    None => false,
                },
                _ => false,
            }
    })
}

fn is_link_local(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_link_local(),
        Some(url::Host::Ipv6(ip)) => {
            let s = ip.segments();
            (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0xfd00 && s[1] == 0x0ec2)
                // `[::ffff:169.254.169.254]` is the IPv4 address, written as IPv6.
                || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_link_local())
        }
        _ => false,
    }
}

/// The host a secret sent to `url` reaches, as scheme, host and port (`https://pay.internal`,
/// `https://pay.internal:8443`): two URLs with the same one reach the same server.
pub(super) fn secret_host(url: &str) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    url.has_host().then(|| url.origin().ascii_serialization())
}

/// A queue URL in a form SQS (or a local endpoint) answers: scheme, host, and a path of
/// exactly `/<account>/<name>`.
pub(super) fn queue_url_ok(value: &str) -> bool {
    let Ok(url) = url::Url::parse(value) else { return false };
    let path_ok = QueueId::account_and_name(value).is_some();
    let scheme_ok = url.scheme() == "https" || remote_url_allowed(value);
    path_ok && scheme_ok && url.query().is_none() && url.username().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Instance metadata and container credentials live on link-local addresses: no agent
    /// may call there, over https or http.
    #[test]
    fn a_link_local_address_is_never_a_remote_service() {
        for bad in [
            "https://169.254.169.254/latest/meta-data",
            "http://169.254.170.2/v2/credentials",
            "https://[fe80::1]/x",
            "https://[fd00:ec2::254]/latest",
            "https://[::ffff:169.254.169.254]/latest/meta-data",
        ] {
            assert!(!remote_url_allowed(bad), "{bad}");
        }
        for ok in [
            "https://pay.example/sas",
            "https://10.0.0.5/sas",
            "http://127.0.0.1:3000",
            "https://[fd00:1::1]/x",
        ] {
            assert!(remote_url_allowed(ok), "{ok}");
        }
    }
}
