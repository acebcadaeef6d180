#!/usr/bin/env bash
# Regenerates the JWT test keys of server/src/auth/token (test-only keys, never used by a
# member). Run from this directory: bash gen.sh
set -euo pipefail
cd "$(dirname "$0")"
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out rsa.key
openssl pkey -in rsa.key -pubout -out rsa.pub
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ec.key
openssl pkey -in ec.key -pubout -out ec.pub
# A second P-256 pair, to test a public key that does not match the private one.
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ec-other.key
openssl pkey -in ec-other.key -pubout -out ec-other.pub
openssl genpkey -algorithm ED25519 -out ed.key
openssl pkey -in ed.key -pubout -out ed.pub
