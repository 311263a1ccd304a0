# The one EnvPool image: the operator (`envpool operator`), the pool server in each
# RayCluster head (`envpool serve`), and the Ray head/workers that host the env actors.
# The Helm chart's `image.repository`/`image.tag` names it for all of them.
#
#   docker build -t ghcr.io/envpool-dev/envpool:0.1.0 .
#   docker build --build-arg RAY_IMAGE=rayproject/ray:2.60.0-py311-gpu -t my/envpool:gpu .
#
# Trainers attach to the pool through Ray, so their Ray and Python versions must
# match this image's: pick RAY_IMAGE to match the Ray you train with.
ARG RAY_IMAGE=rayproject/ray:2.60.0-py311
FROM ${RAY_IMAGE}

# The Ray images run as user "ray" (uid 1000, gid 100), which owns the Python
# environment; the chart's pod security context uses the same ids.
USER 1000:100
WORKDIR /home/ray/envpool

# Ray itself comes from the base image (pip keeps it: it meets the requirement).
COPY --chown=1000:100 pyproject.toml README.md ./
COPY --chown=1000:100 remote_env ./remote_env
COPY --chown=1000:100 operator ./operator
RUN pip install --no-cache-dir . && envpool --help >/dev/null

ENV PYTHONUNBUFFERED=1
# No ENTRYPOINT: KubeRay sets the Ray containers' command, the chart the operator's.
CMD ["envpool", "--help"]
