"""The local lab the demo and the tests share: a TLS HTTP/2 origin, an idle-dropping relay, a client.

Owns nothing but re-exports: ``tlsca`` (throwaway CA and server certificate as PEM files),
``loopthread`` (the start, stop and ``with`` every server here shares), ``origin``
(``TlsH2Origin``, the stand-in for an NVCF endpoint, which can also crash and come back; its
connections in ``h2server``), ``relay`` (``IdleRelay``, Global Accelerator's idle drop scaled
down), ``faultrelay`` (``FaultRelay``: blackhole, reset, delay, rate limit and restart on
command), ``nvcf`` (``NvcfLab``: NVCF's 202 and status polls, for an origin) and ``h2client`` (a
blocking HTTP/2 client that sends no PINGs unless asked). Everything here binds loopback only and
is meant for demos and tests, never for serving real traffic.
"""

from .faultrelay import FaultRelay
from .h2client import H2Client, H2ClientError, H2Response, h2_request
from .nvcf import NvcfLab
from .origin import TlsH2Origin
from .relay import IdleRelay
from .tlsca import CertPaths, make_ca_and_cert

__all__ = [
    "CertPaths",
    "FaultRelay",
    "H2Client",
    "H2ClientError",
    "H2Response",
    "IdleRelay",
    "NvcfLab",
    "TlsH2Origin",
    "h2_request",
    "make_ca_and_cert",
]
