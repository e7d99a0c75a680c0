# Roofline on a CUDA machine:
#   docker build -t roofline .
#   docker run --gpus all -p 8501:8501 --security-opt seccomp=unconfined --security-opt apparmor=unconfined roofline
#   (the two options let the workbench's jail, bubblewrap, make its namespaces: README, "Threat model")
# A GPU pool (README, "A class on a GPU pool"), the same image with another command, TLS with certificates
# made once by `bash scripts/pool_certs.sh ./pool-certs` (README, "Threat model: the web surface and the pool"):
#   docker run -p 8786:8786 -v $PWD/pool-certs:/certs:ro -e ROOFLINE_POOL_CERTS=/certs roofline \
#     python -m labs.engine.pool scheduler
#   docker run --gpus all --network host -v $PWD/pool-certs:/certs:ro -e ROOFLINE_POOL_CERTS=/certs roofline \
#     python -m labs.engine.pool worker tls://SCHEDULER:8786
#   docker run -p 8501:8501 -v $PWD/pool-certs:/certs:ro -e ROOFLINE_POOL_CERTS=/certs \
#     -e ROOFLINE_CLUSTER=tls://SCHEDULER:8786 roofline
# Only the app's port is exposed: the scheduler's 8786 is published only where the pool is asked for (-p above).
# The base image carries CUDA PyTorch, nvcc and gcc (Triton compiles with a C compiler at run time;
# the CUDA C++ labs build with nvcc).
FROM pytorch/pytorch:2.7.1-cuda12.8-cudnn9-devel

RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential curl bubblewrap util-linux \
 && rm -rf /var/lib/apt/lists/*

# a non-root user with a writable home: Triton and torch cache compiled kernels there
RUN useradd --create-home --uid 1000 roofline
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY --chown=roofline:roofline . .
# the class store (labs/classroom): one SQLite file on a volume, so learners' work outlives the container
# (or ROOFLINE_DB=postgresql://... for several replicas; ROOFLINE_INSTRUCTOR_KEY sets the board's key)
RUN mkdir -p /data && chown roofline:roofline /data
VOLUME /data
USER roofline
ENV HOME=/home/roofline \
    ROOFLINE_DB=/data/roofline.sqlite3 \
    TRITON_CACHE_DIR=/home/roofline/.triton \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
  CMD curl -fsS http://localhost:8501/_stcore/health || exit 1
CMD ["streamlit", "run", "app.py", "--server.address=0.0.0.0", "--server.port=8501", "--server.headless=true"]
