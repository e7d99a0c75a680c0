#!/usr/bin/env bash
# Certificates for the GPU pool's TLS (README, "Threat model: the web surface and the pool"):
#   bash scripts/pool_certs.sh [DIR]        DIR defaults to $ROOFLINE_POOL_CERTS, else ~/.roofline/pool-certs
# makes a private certificate authority (ca.pem, ca-key.pem) and one certificate it signs (pool.pem,
# pool-key.pem) that the scheduler, every worker and every app process present to each other. Dask
# checks both sides of every connection against ca.pem: a client without a certificate signed by this
# CA cannot connect, so it cannot submit anything. Copy ca.pem, pool.pem and pool-key.pem to each machine of
# the pool (into the folder ROOFLINE_POOL_CERTS names); keep ca-key.pem off them (it signs new members).
set -euo pipefail
dir="${1:-${ROOFLINE_POOL_CERTS:-$HOME/.roofline/pool-certs}}"
days="${ROOFLINE_POOL_CERT_DAYS:-397}"
mkdir -p "$dir"
chmod 700 "$dir"
cd "$dir"
umask 077
curve=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
# 1. the pool's own certificate authority
openssl req -x509 "${curve[@]}" -days "$days" -subj "/CN=roofline-pool-ca" -keyout ca-key.pem -out ca.pem \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
# 2. the members' certificate, signed by it, good for both ends of a connection
openssl req "${curve[@]}" -subj "/CN=roofline-pool" -keyout pool-key.pem -out pool.csr 2>/dev/null
cat > pool.ext <<'EXT'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:roofline-pool
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid,issuer
EXT
openssl x509 -req -in pool.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days "$days" -extfile pool.ext \
  -out pool.pem 2>/dev/null
rm -f pool.csr pool.ext ca.srl
chmod 644 ca.pem pool.pem
echo "GPU pool certificates in $dir: ca.pem, pool.pem, pool-key.pem (copy these three) and ca-key.pem (keep it here)."
