# The fair size anchor for engine-cuda: `pip install vllm==VERSION` into a venv on the same
# base, nothing removed (pip's own cache aside: PIP_NO_CACHE_DIR, as any image would).
# `nox -s build_cuda` builds it beside kiln/engine-cuda and reports both sizes.
# The first stage repeats engine-cuda's `wheels` stage instruction for instruction, so the
# legacy builder's layer cache serves it: the multi-GB download happens once for both.
# benchmarks/build_cuda.py serves that stage's /wheels over HTTP from a container on the
# build network (WHEELS_URL) and the image installs from there with --no-index: what
# `pip install` from the index installs (the same resolver chose those wheels), in one
# RUN, so neither the wheels nor a second copy of the venv is in any layer of the image.
ARG BASE_IMAGE=kiln/base:bookworm

FROM ${BASE_IMAGE} AS wheels
ARG ENGINE_VERSION
COPY _kiln/ca.crt /tmp/kiln-ca.crt
COPY _kiln/common/with-ca /usr/local/bin/kiln-with-ca
RUN kiln-with-ca sh -c 'apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv'
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT=180
# Optional pre-fetched wheels (wheelhouse.txt); empty by default: everything from PyPI.
COPY _kiln/wheels/ /tmp/wheels/
# `pip wheel` resolves exactly as `pip install` does; "Saved" lines are the progress.
RUN python3 -m venv /opt/pip \
 && kiln-with-ca /opt/pip/bin/pip wheel --progress-bar off --find-links /tmp/wheels -w /wheels "vllm==${ENGINE_VERSION}" \
 && echo "wheels: $(ls /wheels | wc -l) files, $(du -sh /wheels | cut -f1)"

# The image: the base, Python from apt (apt's cache and lists dropped, as Debian's own
# images do, so the anchor is not inflated by bytes that are not vLLM's), and the venv.
FROM ${BASE_IMAGE}
ARG ENGINE_VERSION
ARG WHEELS_URL
COPY _kiln/ca.crt /tmp/kiln-ca.crt
COPY _kiln/common/with-ca /usr/local/bin/kiln-with-ca
RUN kiln-with-ca sh -c 'apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /etc/apt/apt.conf.d/99kiln-ca' \
 && rm /tmp/kiln-ca.crt /usr/local/bin/kiln-with-ca
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT=180
RUN test -n "$WHEELS_URL" \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --progress-bar off --no-index --find-links "$WHEELS_URL" \
      --trusted-host "$(echo "$WHEELS_URL" | cut -d/ -f3 | cut -d: -f1)" "vllm==${ENGINE_VERSION}"
ENV PATH=/opt/venv/bin:$PATH
ENTRYPOINT ["vllm"]
