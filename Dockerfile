# hvd_gradq on Debian 12 (bookworm): the same one-command set-up as on a bare machine,
# scripts/setup.sh (Open MPI, .venv/, torch CPU, tensorflow-cpu, Horovod built from its sdist
# with the C++17 fixes, `pip install -e .`).
#
#   docker build -t hvd_gradq .
#   docker run --rm --shm-size=1g --cap-add NET_ADMIN --cap-add SYS_ADMIN \
#     --security-opt apparmor=unconfined hvd_gradq         # runs scripts/test.sh
#
# The capabilities are for the emulated network of tests/parallel/test_netemu.py (bench/netemu/):
# NET_ADMIN for veth, bridge and tc, SYS_ADMIN for `ip netns add/exec` (they mount); AppArmor's
# default container profile denies mounts. Without them that test fails (not skipped).
#
# Offline torch: wheels put in .docker-wheels/ of the build context (scripts/docker_check.sh
# does this) are lent to setup.sh as /opt/wheels during the set-up step only, and never land
# in a layer of the image; without them setup.sh takes torch from the PyTorch CPU index.

# The build context as COPY sees it (.dockerignore applied), with the optional wheels moved
# out of the tree to /wheels.
FROM debian:bookworm-slim AS src
COPY . /ctx
RUN mkdir -p /wheels \
 && if [ -d /ctx/.docker-wheels ]; then \
      find /ctx/.docker-wheels -maxdepth 1 -name '*.whl' -exec mv -t /wheels {} + \
      && rm -rf /ctx/.docker-wheels; \
    fi

FROM debian:bookworm-slim

# Must equal the pins in scripts/setup.sh (tests/unit/test_dockerfile.py checks this).
ARG HOROVOD_VERSION=0.28.1
ARG TORCH_VERSION=2.13.0
ARG TF_VERSION=2.15.1

SHELL ["/bin/bash", "-euo", "pipefail", "-c"]

LABEL org.opencontainers.image.title="hvd_gradq" \
      org.opencontainers.image.description="Horovod gradient-compression plugin: Horovod ${HOROVOD_VERSION}, torch ${TORCH_VERSION} (CPU), tensorflow-cpu ${TF_VERSION}, Open MPI, Gloo"

# No apt-get here: setup.sh installs every Debian package itself, python3 and python3-venv
# included (it runs as root in the build, so without sudo). The image holds nothing that a bare
# machine running setup.sh would not (tests/unit/test_dockerfile.py checks this).
ENV OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/hvd_gradq/.venv/bin:$PATH

WORKDIR /opt/hvd_gradq

# Two steps, so that a change to the code does not rebuild the environment: first setup.sh alone
# makes everything but the project (apt, .venv/, torch, TensorFlow, Horovod built from its sdist:
# most of the build's 15-20 minutes), in a layer that only a change to setup.sh invalidates; then
# the tree arrives and setup.sh, run again, skips what is done and installs the project and
# compiles its kernels (a minute or two).
#
# setup.sh pins the versions itself, so a --build-arg that differs from them fails loudly here
# rather than being silently ignored. The wheels from the src stage are bind-mounted, and
# /opt/wheels (where setup.sh looks) points at them for this step only. Caches (pip's,
# setup.sh's Horovod wheel) live in /tmp for this step only.
COPY scripts/setup.sh /opt/hvd_gradq/scripts/setup.sh
RUN --mount=type=bind,from=src,source=/wheels,target=/tmp/lent-wheels \
    for pin in "HOROVOD_VERSION=${HOROVOD_VERSION}" "TORCH_VERSION=${TORCH_VERSION}" \
               "TF_VERSION=${TF_VERSION}"; do \
      grep -qx "${pin}" scripts/setup.sh \
        || { echo "Dockerfile ARG ${pin} differs from scripts/setup.sh" >&2; exit 1; }; \
    done \
 && if [ -n "$(find /tmp/lent-wheels -maxdepth 1 -name '*.whl')" ]; then \
      ln -s /tmp/lent-wheels /opt/wheels; \
    fi \
 && PIP_NO_CACHE_DIR=1 HVD_GRADQ_CACHE=/tmp/hvd_gradq-cache HVD_GRADQ_SETUP_DEPS_ONLY=1 \
      bash scripts/setup.sh \
 && rm -rf /opt/wheels /tmp/hvd_gradq-cache /root/.cache /var/lib/apt/lists/*

COPY --from=src /ctx /opt/hvd_gradq
RUN PIP_NO_CACHE_DIR=1 bash scripts/setup.sh

# DL3059 (consecutive RUNs): the check is its own step on purpose, the last one, so that a
# build log shows it apart and tests/unit/test_dockerfile.py can find it.
# hadolint ignore=DL3059
RUN horovodrun --check-build

CMD ["bash", "scripts/test.sh"]
