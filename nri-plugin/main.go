// elasticgpu-nri-plugin: the NRI front of the elasticgpu node agent (issue 34).
//
// A small main around NRI's stub (github.com/containerd/nri/pkg/stub), as containerd's sample
// plugins are: it decides nothing. At each event it marshals NRI's own messages (protojson) to the
// Python agent over a local unix socket (-agent-socket), one JSON line per request, and turns the
// agent's answer back into NRI's: the ContainerAdjustment to apply, or an error that fails the
// creation with the agent's words. Every decision (claim bound to this node, card check,
// privileged rules, isolation mode, MIG, RDMA, limits files, device nodes) stays in Python
// (elasticgpu/agent/injecting, translated by elasticgpu/agent/nri).
//
// When the agent does not answer a CreateContainer (not listening, closed, past -timeout):
//   - a container its pod names a claim for (pod annotation egpuc.elasticgpu.io/<container> or
//     elasticgpu.io/request.<container>) is refused: it must not run without its cards; kubelet
//     retries it with backoff;
//   - any other container is created with NVIDIA_VISIBLE_DEVICES=void (-unanswered-env), as the
//     agent would have done, so that a CUDA image's `all` gets no card through the NVIDIA hook.
//
// A container of neither kind that names a key of -unanswered-env twice (the image's ENV and the pod's env) with a
// last value that gives a card is refused too: NRI replaces one entry and the runtime keeps the last (issue 44).
//
// The stub is NRI v0.8's, the first that joins a Synchronize the runtime splits past ttrpc's 4 MiB
// (containerd/nri#111; containerd 2.x splits one): v0.6's took the first part for the whole and was closed.
// The agent answers a Synchronize at once and settles after (the runtime allows 2 s for all of it).
//
// A Synchronize the agent does not answer ends the plugin (exit 1): the agent, its supervisor,
// starts it again. So does the loss of the runtime's connection, and the end of its parent (the
// agent): NRI then fails open, and the agent's next Synchronize finds what was created meanwhile.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

const (
	claimPrefix  = "egpuc.elasticgpu.io/"
	inlinePrefix = "elasticgpu.io/request."
)

type plugin struct {
	agentSocket   string
	timeout       time.Duration
	unansweredEnv []*api.KeyValue
	pool          chan *conn
	creating      atomic.Int64 // CreateContainers being answered: the plugin does not exit under them
}

type conn struct {
	c net.Conn
	r *bufio.Reader
}

// answer is one line from the agent: exactly one of the fields is set.
type answer struct {
	Adjust json.RawMessage `json:"adjust,omitempty"` // a ContainerAdjustment (protojson)
	Error  string          `json:"error,omitempty"`  // the refusal, said to kubelet as is
}

func (p *plugin) dial() (*conn, error) {
	select {
	case c := <-p.pool:
		return c, nil
	default:
	}
	c, err := net.DialTimeout("unix", p.agentSocket, p.timeout)
	if err != nil {
		return nil, err
	}
	return &conn{c: c, r: bufio.NewReaderSize(c, 1<<16)}, nil
}

func (p *plugin) release(c *conn) {
	select {
	case p.pool <- c:
	default:
		_ = c.c.Close()
	}
}

// ask sends one request and reads one answer; a connection kept from an earlier request that the
// agent closed meanwhile (it restarted) is replaced once.
func (p *plugin) ask(op string, fields map[string]proto.Message, lists map[string][]proto.Message) (*answer, error) {
	line := []byte(`{"op":"` + op + `"`)
	for k, m := range fields {
		b, err := protojson.Marshal(m)
		if err != nil {
			return nil, err
		}
		line = append(line, []byte(`,"`+k+`":`)...)
		line = append(line, b...)
	}
	for k, ms := range lists {
		line = append(line, []byte(`,"`+k+`":[`)...)
		for i, m := range ms {
			b, err := protojson.Marshal(m)
			if err != nil {
				return nil, err
			}
			if i > 0 {
				line = append(line, ',')
			}
			line = append(line, b...)
		}
		line = append(line, ']')
	}
	line = append(line, '}', '\n')
	var last error
	for try := 0; try < 2; try++ {
		c, err := p.dial()
		if err != nil {
			return nil, err
		}
		_ = c.c.SetDeadline(time.Now().Add(p.timeout))
		if _, err = c.c.Write(line); err == nil {
			var got []byte
			if got, err = c.r.ReadBytes('\n'); err == nil {
				a := &answer{}
				if err = json.Unmarshal(got, a); err == nil {
					p.release(c)
					return a, nil
				}
			}
		}
		_ = c.c.Close()
		last = err
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			break // the agent is slow, not gone: a second wait would pass the runtime's own deadline (2 s)
		}
	}
	return nil, last
}

func claimed(pod *api.PodSandbox, ctr *api.Container) bool {
	a := pod.GetAnnotations()
	_, ref := a[claimPrefix+ctr.GetName()]
	_, inline := a[inlinePrefix+ctr.GetName()]
	return ref || inline
}

// namedTwice finds a key of env that the container names more than once with a last value that is neither
// env's nor one that gives no card: NRI's adjustment replaces the first entry and the runtime keeps the last
// (the agent's own check, nri/translating.py, where it answers). n is 0 when there is none.
func namedTwice(ctr *api.Container, env []*api.KeyValue) (key string, n int, last string) {
	for _, kv := range env {
		count, value := 0, ""
		for _, e := range ctr.GetEnv() {
			if k, v, _ := strings.Cut(e, "="); k == kv.Key {
				count, value = count+1, v
			}
		}
		if count < 2 || value == kv.Value {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(value)) {
		case "void", "none", "":
			continue // no card either way
		}
		return kv.Key, count, value
	}
	return "", 0, ""
}

func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	ps := make([]proto.Message, 0, len(pods))
	for _, x := range pods {
		ps = append(ps, x)
	}
	cs := make([]proto.Message, 0, len(ctrs))
	for _, x := range ctrs {
		cs = append(cs, x)
	}
	a, err := p.ask("synchronize", nil, map[string][]proto.Message{"pods": ps, "containers": cs})
	if err == nil && a.Error != "" {
		err = errors.New(a.Error)
	}
	if err != nil {
		// Without the agent's ledger in step, no claim can be checked: start again (the supervisor does).
		fmt.Fprintf(os.Stderr, "elasticgpu-nri-plugin: synchronize: the agent at %s did not answer: %v; exiting\n", p.agentSocket, err)
		os.Exit(1)
	}
	return nil, nil
}

func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	p.creating.Add(1)
	defer p.creating.Add(-1)
	a, err := p.ask("create", map[string]proto.Message{"pod": pod, "container": ctr}, nil)
	if err != nil {
		if claimed(pod, ctr) {
			return nil, nil, fmt.Errorf("pod %s/%s, container %q uses an ElasticGPUClaim, and the elasticgpu agent on this node did not answer (%v); the container is not created without its cards, kubelet retries it", pod.GetNamespace(), pod.GetName(), ctr.GetName(), err)
		}
		if key, n, last := namedTwice(ctr, p.unansweredEnv); n > 0 {
			return nil, nil, fmt.Errorf("pod %s/%s, container %q: its environment names %s %d times (the image's ENV and the pod's env); the runtime keeps the last (%q) and NRI can replace only one entry, and the elasticgpu agent on this node did not answer (%v): remove %s from the container's env in the pod spec; kubelet retries", pod.GetNamespace(), pod.GetName(), ctr.GetName(), key, n, last, err, key)
		}
		return &api.ContainerAdjustment{Env: p.unansweredEnv}, nil, nil
	}
	if a.Error != "" {
		return nil, nil, errors.New(a.Error)
	}
	adjust := &api.ContainerAdjustment{}
	if len(a.Adjust) > 0 {
		if err := protojson.Unmarshal(a.Adjust, adjust); err != nil {
			return nil, nil, fmt.Errorf("elasticgpu agent: its adjustment for container %q cannot be read (%v); kubelet retries", ctr.GetName(), err)
		}
	}
	return adjust, nil, nil
}

// The ledger follows the containers: best effort (the next Synchronize settles what is lost).
func (p *plugin) event(op string, pod *api.PodSandbox, ctr *api.Container) {
	if _, err := p.ask(op, map[string]proto.Message{"pod": pod, "container": ctr}, nil); err != nil {
		fmt.Fprintf(os.Stderr, "elasticgpu-nri-plugin: %s %s: the agent did not answer: %v\n", op, ctr.GetId(), err)
	}
}

func (p *plugin) StopContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.event("stop", pod, ctr)
	return nil, nil
}

func (p *plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.event("remove", pod, ctr)
	return nil
}

func main() {
	var (
		name       = flag.String("name", "elasticgpu", "the plugin's name in NRI")
		idx        = flag.String("idx", "10", "the plugin's index in NRI (its order among plugins)")
		nriSocket  = flag.String("nri-socket", "/var/run/nri/nri.sock", "the runtime's NRI socket")
		agent      = flag.String("agent-socket", "", "the elasticgpu agent's socket (required)")
		timeout    = flag.Duration("timeout", 1500*time.Millisecond, "how long the agent may take to answer one request (below the runtime's plugin_request_timeout, 2s by default)")
		unanswered = flag.String("unanswered-env", "NVIDIA_VISIBLE_DEVICES=void", "env (KEY=VALUE,...) of an unclaimed container created while the agent does not answer; empty: none")
	)
	flag.Parse()
	if *agent == "" {
		fmt.Fprintln(os.Stderr, "elasticgpu-nri-plugin: -agent-socket is required")
		os.Exit(2)
	}
	p := &plugin{agentSocket: *agent, timeout: *timeout, pool: make(chan *conn, 16)}
	for _, kv := range strings.Split(*unanswered, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			p.unansweredEnv = append(p.unansweredEnv, &api.KeyValue{Key: k, Value: v})
		}
	}
	var once sync.Once
	exit := func(why string, code int) {
		once.Do(func() {
			fmt.Fprintf(os.Stderr, "elasticgpu-nri-plugin: %s; exiting\n", why)
			os.Exit(code)
		})
	}
	// The agent is its supervisor: when it is gone (reparented), so is the plugin. NRI then fails open,
	// and the next agent's plugin finds at its Synchronize what was created meanwhile.
	parent := os.Getppid()
	go func() {
		for range time.Tick(200 * time.Millisecond) {
			if os.Getppid() != parent {
				// A CreateContainer in flight is answered first (a claim's is refused: the agent cannot answer):
				// a plugin that vanished under it would let the runtime create the container untouched.
				for deadline := time.Now().Add(2 * p.timeout); p.creating.Load() > 0 && time.Now().Before(deadline); {
					time.Sleep(10 * time.Millisecond)
				}
				exit("the agent (its parent) is gone", 1)
			}
		}
	}()
	s, err := stub.New(p, stub.WithPluginName(*name), stub.WithPluginIdx(*idx), stub.WithSocketPath(*nriSocket),
		stub.WithOnClose(func() { exit("the runtime closed the NRI connection", 1) }))
	if err != nil {
		exit(fmt.Sprintf("cannot make the NRI stub: %v", err), 1)
	}
	if err := s.Run(context.Background()); err != nil {
		exit(fmt.Sprintf("NRI: %v", err), 1)
	}
	exit("NRI stub stopped", 0)
}
