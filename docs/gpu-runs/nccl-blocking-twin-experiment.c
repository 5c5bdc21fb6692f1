// Experiment (see run.sh): blocking child split off a non-blocking parent; per-op cost by mode;
// a blocking communicator whose peer never joins: does the launch block, and does ncclCommAbort
// from a watchdog thread free it (first op = lazy connect; later ops = a stuck kernel)?
#include <nccl.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static ncclUniqueId id, id2, id3;
static pthread_barrier_t bar;
#define P(...) do{printf(__VA_ARGS__);fflush(stdout);}while(0)
static int wait_ready(ncclComm_t c, const char* what, int r){
  ncclResult_t s=ncclInProgress; double t0=now();
  while(s==ncclInProgress){ if(ncclCommGetAsyncError(c,&s)!=ncclSuccess){P("[r%d] %s: GetAsyncError failed\n",r,what);return 1;} if(now()-t0>20){P("[r%d] %s: still in progress after 20 s\n",r,what);return 1;} }
  if(s!=ncclSuccess){P("[r%d] %s: async error %s\n",r,what,ncclGetErrorString(s));return 1;}
  return 0;
}
static double loop(ncclComm_t c, cudaStream_t st, float* x, float* y, int n, int nb, int r, double* gpu){
  cudaEvent_t a,b; cudaEventCreate(&a); cudaEventCreate(&b);
  for(int i=0;i<50;i++){ ncclResult_t e=ncclAllReduce(x,y,2,ncclFloat,ncclSum,c,st); if(e!=ncclSuccess&&e!=ncclInProgress){P("[r%d] warm allreduce %s\n",r,ncclGetErrorString(e));return -1;} if(nb&&wait_ready(c,"warm",r)) return -1;}
  cudaStreamSynchronize(st);
  pthread_barrier_wait(&bar);
  double t0=now(); cudaEventRecord(a,st);
  for(int i=0;i<n;i++){ ncclResult_t e=ncclAllReduce(x,y,2,ncclFloat,ncclSum,c,st); if(e!=ncclSuccess&&e!=ncclInProgress){P("[r%d] allreduce %s\n",r,ncclGetErrorString(e));return -1;} if(nb) wait_ready(c,"op",r);}
  double host=now()-t0; cudaEventRecord(b,st); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms,a,b); *gpu=ms*1e3/n;
  return host*1e6/n;
}
struct busy_arg { volatile int stop; int dev; };
static void* busy(void* p){ struct busy_arg* a=p; cudaSetDevice(a->dev); cudaEvent_t e; cudaEventCreateWithFlags(&e,cudaEventDisableTiming); cudaEventRecord(e,0); while(!a->stop){ cudaEventQuery(e);} return NULL;}
static ncclComm_t victim;
static void* wd(void* p){ sleep(2); double t=now(); ncclResult_t e=ncclCommAbort(victim); P("[r0] watchdog (%s): ncclCommAbort -> %s in %.1f ms\n",(char*)p,ncclGetErrorString(e),(now()-t)*1e3); return NULL; }
static void stall_test(const char* name, ncclComm_t c, cudaStream_t st, float* x, float* y, int n){
  victim=c; pthread_t w; pthread_create(&w,NULL,wd,(void*)name);
  double t=now(); int i; ncclResult_t e=ncclSuccess;
  for(i=0;i<n;i++){ e=ncclAllReduce(x,y,2,ncclFloat,ncclSum,c,st); if(e!=ncclSuccess) break; }
  P("[r0] %s: %d of %d launches returned after %.1f ms, last %s\n",name,i,n,(now()-t)*1e3,ncclGetErrorString(e));
  pthread_join(w,NULL);
  cudaError_t ce=cudaStreamSynchronize(st); P("[r0] %s: stream sync after abort: %s after %.1f ms\n",name,cudaGetErrorString(ce),(now()-t)*1e3);
}
static void* rank_main(void* arg){
  int r=(int)(long)arg; cudaSetDevice(r); cudaStream_t st; cudaStreamCreateWithFlags(&st,cudaStreamNonBlocking);
  float *x,*y; cudaMalloc((void**)&x,64); cudaMalloc((void**)&y,64); cudaMemset(x,0,64); cudaDeviceSynchronize();
  ncclConfig_t cfg=NCCL_CONFIG_INITIALIZER; cfg.blocking=0; ncclComm_t nb; double t0=now();
  ncclResult_t e=ncclCommInitRankConfig(&nb,2,id,r,&cfg); P("[r%d] nb init -> %s\n",r,ncclGetErrorString(e));
  if(wait_ready(nb,"nb init",r)) return NULL; P("[r%d] nb init ready %.1f ms\n",r,(now()-t0)*1e3);
  ncclConfig_t bc=NCCL_CONFIG_INITIALIZER; bc.blocking=1; ncclComm_t ch=NULL; t0=now();
  e=ncclCommSplit(nb,0,r,&ch,&bc); P("[r%d] split(nb parent, blocking child) -> %s after %.1f ms, child %p\n",r,ncclGetErrorString(e),(now()-t0)*1e3,(void*)ch);
  int ok = e==ncclSuccess||e==ncclInProgress;
  if(ok && wait_ready(nb,"split(parent)",r)) ok=0;
  if(ok && ch && wait_ready(ch,"split(child)",r)) ok=0;
  if(ok) P("[r%d] split ready %.1f ms\n",r,(now()-t0)*1e3);
  double g,h;
  h=loop(nb,st,x,y,2000,1,r,&g); P("[r%d] nb parent: host %.2f us/op gpu %.2f us/op\n",r,h,g);
  if(ok&&ch){ h=loop(ch,st,x,y,2000,0,r,&g); P("[r%d] blocking child: host %.2f us/op gpu %.2f us/op\n",r,h,g); }
  // A directly initialised blocking communicator (the reference) and a second one for the lazy-connect stall.
  ncclComm_t bl, bl2; e=ncclCommInitRankConfig(&bl,2,id2,r,&bc); P("[r%d] blocking init -> %s\n",r,ncclGetErrorString(e));
  e=ncclCommInitRankConfig(&bl2,2,id3,r,&bc); P("[r%d] blocking init 2 -> %s\n",r,ncclGetErrorString(e));
  h=loop(bl,st,x,y,2000,0,r,&g); P("[r%d] blocking comm: host %.2f us/op gpu %.2f us/op\n",r,h,g);
  h=loop(bl,st,x,x,2000,0,r,&g); P("[r%d] blocking comm in place: host %.2f us/op gpu %.2f us/op\n",r,h,g);
  // The same with an explicit group around each call (as the backend launches).
  pthread_barrier_wait(&bar);
  { double t=now(); for(int i=0;i<2000;i++){ ncclGroupStart(); ncclAllReduce(x,y,2,ncclFloat,ncclSum,bl,st); ncclGroupEnd(); } double d=(now()-t)*1e6/2000; cudaStreamSynchronize(st); P("[r%d] blocking comm, explicit group per op: host %.2f us/op\n",r,d); }
  // With a second thread of the process busy in the CUDA driver meanwhile (as an issuing thread is).
  pthread_barrier_wait(&bar);
  { struct busy_arg ba={0,r}; pthread_t nb2;
    pthread_create(&nb2,NULL,busy,(void*)&ba);
    double t=now(); for(int i=0;i<2000;i++){ ncclAllReduce(x,y,2,ncclFloat,ncclSum,bl,st); } double d=(now()-t)*1e6/2000; cudaStreamSynchronize(st); ba.stop=1; pthread_join(nb2,NULL); P("[r%d] blocking comm, another thread polling a CUDA event meanwhile: host %.2f us/op\n",r,d); }
  // Launch cost alone: 200 ops back to back, host time of the calls only (GPU-bound loop above).
  pthread_barrier_wait(&bar);
  { double t=now(); for(int i=0;i<200;i++) ncclAllReduce(x,y,2,ncclFloat,ncclSum,bl,st); double d=(now()-t)*1e6/200; cudaStreamSynchronize(st); P("[r%d] blocking comm: call cost %.2f us/op (200 back to back)\n",r,d); }
  pthread_barrier_wait(&bar);
  if(getenv("NOSTALL")) { }
  else if(r==0){
    stall_test("connected comm, peer absent", bl, st, x, y, 20000);
    stall_test("fresh comm (lazy connect), peer absent", bl2, st, x, y, 10);
  } else { sleep(12); }
  pthread_barrier_wait(&bar);
  P("[r%d] teardown\n",r);
  if(getenv("NOSTALL")){
    double t=now(); ncclResult_t e1=ncclCommFinalize(ch); double t1=now(); ncclResult_t e2=ncclCommDestroy(ch); double t2=now();
    P("[r%d] twin (blocking child): finalize %s %.1f ms, destroy %s %.1f ms\n",r,ncclGetErrorString(e1),(t1-t)*1e3,ncclGetErrorString(e2),(t2-t1)*1e3);
    t=now(); e1=ncclCommFinalize(nb); wait_ready(nb,"finalize",r); t1=now(); e2=ncclCommDestroy(nb); t2=now();
    P("[r%d] parent (non-blocking): finalize %s %.1f ms, destroy %s %.1f ms\n",r,ncclGetErrorString(e1),(t1-t)*1e3,ncclGetErrorString(e2),(t2-t1)*1e3);
    t=now(); e1=ncclCommAbort(bl); P("[r%d] blocking comm (used): abort %s %.1f ms\n",r,ncclGetErrorString(e1),(now()-t)*1e3);
    t=now(); e1=ncclCommFinalize(bl2); t1=now(); e2=ncclCommDestroy(bl2); t2=now();
    P("[r%d] blocking comm (never used): finalize %s %.1f ms, destroy %s %.1f ms\n",r,ncclGetErrorString(e1),(t1-t)*1e3,ncclGetErrorString(e2),(t2-t1)*1e3);
    // clock cost
    struct timespec ts; double c0=now(); for(int i=0;i<100000;i++) clock_gettime(CLOCK_MONOTONIC,&ts); P("[r%d] clock_gettime: %.1f ns\n",r,(now()-c0)*1e9/100000);
    return NULL;
  }
  if(r==1){ ncclCommAbort(bl); ncclCommAbort(bl2); }
  if(ch) ncclCommAbort(ch);
  ncclCommAbort(nb);
  return NULL;
}
int main(){ int n; cudaGetDeviceCount(&n); int v; ncclGetVersion(&v); P("NCCL %d, %d GPUs\n",v,n); if(n<2){P("need 2 GPUs\n");return 2;}
  ncclGetUniqueId(&id); ncclGetUniqueId(&id2); ncclGetUniqueId(&id3); pthread_barrier_init(&bar,NULL,2); pthread_t t[2];
  for(long r=0;r<2;r++) pthread_create(&t[r],NULL,rank_main,(void*)r);
  for(int r=0;r<2;r++) pthread_join(t[r],NULL);
  if(getenv("NOSTALL")){ // world size 1, as the unwaited-collective exit case
    cudaSetDevice(0); ncclUniqueId u; ncclGetUniqueId(&u); ncclConfig_t c0=NCCL_CONFIG_INITIALIZER; c0.blocking=0; ncclComm_t p; double t=now();
    ncclCommInitRankConfig(&p,1,u,0,&c0); wait_ready(p,"ws1 init",0); double ti=now();
    ncclConfig_t c1=NCCL_CONFIG_INITIALIZER; c1.blocking=1; ncclComm_t k=NULL; ncclCommSplit(p,0,0,&k,&c1); wait_ready(p,"ws1 split",0); wait_ready(k,"ws1 split child",0); double ts=now();
    P("ws1: init %.1f ms, twin split %.1f ms\n",(ti-t)*1e3,(ts-ti)*1e3);
    t=now(); ncclResult_t e1=ncclCommFinalize(k); double t1=now(); ncclCommDestroy(k); double t2=now();
    P("ws1 twin: finalize %s %.1f ms, destroy %.1f ms\n",ncclGetErrorString(e1),(t1-t)*1e3,(t2-t1)*1e3);
    t=now(); ncclCommFinalize(p); wait_ready(p,"ws1 finalize",0); t1=now(); ncclCommDestroy(p); t2=now();
    P("ws1 parent: finalize %.1f ms, destroy %.1f ms\n",(t1-t)*1e3,(t2-t1)*1e3);
  }
  P("done\n"); return 0; }
