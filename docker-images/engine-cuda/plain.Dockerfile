# The fair size anchor for engine-cuda: `pip install vllm==VERSION` into a venv on the same
# base, nothing removed (pip's own cache aside: PIP_NO_CACHE_DIR, as any image would).
# `nox -s build_cuda` builds it beside kiln/engine-cuda and reports both sizes.
# It installs the same locked set as engine-cuda (the lock's python_packages) plus what
# plain `pip install vllm` adds that kiln leaves out (plain_extra_packages: torchaudio,
# torchcodec, PyNvVideoCodec, OpenCV and their closure), every wheel by its locked hash,
# nothing resolved, so the comparison is of the same versions.
# The first stage repeats engine-cuda's `wheels` stage instruction for instruction, so the
# legacy builder's layer cache serves it: the wheels are copied once for both.
# benchmarks/build_cuda.py serves that stage's /wheels over HTTP from a container on the
# build network (WHEELS_URL) and the image installs from there with --no-index: in one
# RUN, so neither the wheels nor a second copy of the venv is in any layer of the image.
ARG BASE_IMAGE=kiln/base:bookworm

FROM ${BASE_IMAGE} AS wheels
ARG SOURCE_DATE_EPOCH=0
COPY _kiln/ca.crt /tmp/kiln-ca.crt
COPY _kiln/common/with-ca /usr/local/bin/kiln-with-ca
COPY _kiln/common/kiln-apt-install /usr/local/bin/kiln-apt-install
COPY _kiln/common/kiln-lock-tool /usr/local/bin/kiln-lock-tool
COPY _kiln/lock/ /tmp/kiln-lock/
RUN kiln-with-ca kiln-apt-install /tmp/kiln-lock/debian.txt python3
COPY _kiln/wheels/ /wheels/
RUN kiln-lock-tool verify /wheels /tmp/kiln-lock/plain-wheels.txt \
 && kiln-lock-tool uv /wheels /tmp/kiln-lock/uv.txt /usr/local/bin/uv \
 && echo "wheels: $(ls /wheels | wc -l) files, $(du -sh /wheels | cut -f1)"

# The image: the base, Python from apt at the locked versions (apt's cache and lists
# dropped, as Debian's own images do, so the anchor is not inflated by bytes that are not
# vLLM's), and the venv.
FROM ${BASE_IMAGE}
ARG ENGINE_VERSION
ARG WHEELS_URL
ARG SOURCE_DATE_EPOCH=0
COPY _kiln/ca.crt /tmp/kiln-ca.crt
COPY _kiln/common/with-ca /usr/local/bin/kiln-with-ca
COPY _kiln/common/kiln-apt-install /usr/local/bin/kiln-apt-install
COPY _kiln/lock/debian.txt _kiln/lock/plain.txt /tmp/kiln-lock/
RUN kiln-with-ca kiln-apt-install /tmp/kiln-lock/debian.txt python3 python3-venv \
 && rm -rf /etc/apt/apt.conf.d/99kiln-ca /tmp/kiln-ca.crt /usr/local/bin/kiln-with-ca /usr/local/bin/kiln-apt-install
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT=180
RUN test -n "$WHEELS_URL" \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --progress-bar off --no-index --find-links "$WHEELS_URL" \
      --trusted-host "$(echo "$WHEELS_URL" | cut -d/ -f3 | cut -d: -f1)" \
      --require-hashes --no-deps -r /tmp/kiln-lock/plain.txt \
 && rm -rf /tmp/kiln-lock
ENV PATH=/opt/venv/bin:$PATH
ENTRYPOINT ["vllm"]
