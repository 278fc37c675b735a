#!/bin/sh
# Verify a genhook webhook's Ed25519 signature with the openssl command (OpenSSL >= 3.0).
#   verify_openssl.sh BODY_FILE TIMESTAMP SIGNATURE KEY_X
# BODY_FILE: the exact bytes received; TIMESTAMP: X-Service-Webhook-Timestamp;
# SIGNATURE: X-Service-Webhook-Signature-Ed25519; KEY_X: the "x" of the JWK whose "kid"
# equals X-Service-Webhook-Key-Id, e.g.
#   curl -s "$BASE/api/v1/webhooks/jwks.json" | jq -r --arg k "$KID" '.keys[]|select(.kid==$k).x'
set -eu
body=$1 timestamp=$2 signature=$3 key_x=$4

now=$(date +%s)
if [ $((now - timestamp)) -gt 300 ] || [ $((timestamp - now)) -gt 300 ]; then
    echo "refused: timestamp outside the 300 s window" >&2
    exit 1
fi

b64url_decode() {
    s=$(printf '%s' "$1" | tr -d '=' | tr '_-' '/+')
    case $((${#s} % 4)) in 2) s="$s==" ;; 3) s="$s=" ;; esac
    printf '%s' "$s" | openssl base64 -d -A
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# An Ed25519 SubjectPublicKeyInfo is a fixed 12-byte DER prefix followed by the 32-byte key.
{ printf '\060\052\060\005\006\003\053\145\160\003\041\000'; b64url_decode "$key_x"; } >"$tmp/key.der"
{ printf '%s.' "$timestamp"; cat "$body"; } >"$tmp/message"
b64url_decode "$signature" >"$tmp/signature"
openssl pkeyutl -verify -pubin -keyform DER -inkey "$tmp/key.der" -rawin \
    -in "$tmp/message" -sigfile "$tmp/signature"

# Legacy HMAC (X-Service-Webhook-Signature), raw body only; compare the hex strings:
#   openssl dgst -sha256 -hmac "$SIGNING_SECRET" -hex <"$body" | sed 's/^.* //'
