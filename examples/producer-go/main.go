// Command ductor-producer starts (and optionally cancels) Ductor workflow runs
// by writing request records to <prefix>.requests with a plain Kafka client:
// an upstream service needs no Ductor library, only the record contract of
// schemas/request.schema.json.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// start and signal mirror the two shapes of the schema. It refuses unknown
// and null properties, so the optional ones are omitted when unset.
type start struct {
	RequestVersion  int    `json:"request_version"`
	Kind            string `json:"kind"`
	RunID           string `json:"run_id"`
	Workflow        string `json:"workflow"`
	WorkflowVersion int    `json:"workflow_version,omitempty"` // 0: the latest registered
	Input           any    `json:"input,omitempty"`
	Tier            string `json:"tier,omitempty"` // "t0", "t1" or "t2"; Ductor's default is t1
}

type signal struct {
	RequestVersion int    `json:"request_version"`
	Kind           string `json:"kind"`
	RunID          string `json:"run_id"`
	Name           string `json:"name"`
	SignalID       string `json:"signal_id"`
	Payload        any    `json:"payload,omitempty"`
}

// envOr defaults a flag to the DUCTOR_* variable the ductor command reads, so
// one environment configures both.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func main() {
	brokers := flag.String("brokers", envOr("DUCTOR_BOOTSTRAP_SERVERS", "127.0.0.1:19092"), "comma-separated Kafka bootstrap servers (env DUCTOR_BOOTSTRAP_SERVERS)")
	prefix := flag.String("topic-prefix", envOr("DUCTOR_TOPIC_PREFIX", "ductor"), "topic prefix: records go to <prefix>.requests (env DUCTOR_TOPIC_PREFIX)")
	workflow := flag.String("workflow", "", "registered workflow to start (required)")
	runs := flag.Int("runs", 1, "number of runs to start")
	runPrefix := flag.String("run-prefix", "go-producer", "run ids are <run-prefix>-<i>, i from 1")
	cancel := flag.Bool("cancel", false, "after the starts, send each run a cancel signal")
	timeout := flag.Duration("timeout", 30*time.Second, "fail unless every record is acknowledged within this time")
	flag.Parse()
	if *workflow == "" || *runs < 1 || *timeout <= 0 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "ductor-producer: -workflow is required; -runs and -timeout must be positive; no arguments")
		flag.Usage()
		os.Exit(2)
	}

	var starts, cancels []*kgo.Record
	for i := 1; i <= *runs; i++ {
		runID := fmt.Sprintf("%s-%d", *runPrefix, i)
		starts = append(starts, record(runID, start{
			RequestVersion: 1, Kind: "start", RunID: runID, Workflow: *workflow,
			Input: map[string]int{"order": i},
		}))
		if *cancel {
			// Deriving the signal id from the run id makes a rerun of this
			// program send the very same cancel, which Ductor applies once.
			cancels = append(cancels, record(runID, signal{
				RequestVersion: 1, Kind: "signal", RunID: runID, Name: "cancel", SignalID: runID + ":cancel",
			}))
		}
	}

	topic := *prefix + ".requests"
	if err := run(strings.Split(*brokers, ","), topic, *timeout, starts, cancels); err != nil {
		fmt.Fprintf(os.Stderr, "ductor-producer: producing to %s via %s failed:\n%v\n", topic, *brokers, err)
		os.Exit(1)
	}
}

// record keys the value by run id, so Kafka puts every request of a run on
// one partition, which is what keeps a run's requests in order for Ductor.
func record(runID string, v any) *kgo.Record {
	value, err := json.Marshal(v)
	if err != nil {
		panic(err) // plain structs, maps and strings cannot fail to encode
	}
	return &kgo.Record{Key: []byte(runID), Value: value}
}

func run(brokers []string, topic string, timeout time.Duration, starts, cancels []*kgo.Record) error {
	// franz-go's defaults suit the contract: an idempotent producer with
	// acks=all, whose retries neither lose, duplicate nor reorder a partition's
	// records (a run's start stays ahead of its cancel). Rerunning the program
	// is safe too, as Ductor dedups starts by run id and signals by signal_id.
	// Auto topic creation is off, so a wrong prefix fails, creating nothing.
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.DefaultProduceTopic(topic),
		// The context bounds waiting for a topic or broker, but cannot cancel
		// an idempotent batch already sent; this bounds its retries as well.
		kgo.RecordDeliveryTimeout(timeout),
	)
	if err != nil {
		return err
	}
	defer cl.Close()

	ctx, stop := context.WithTimeout(context.Background(), timeout)
	defer stop()
	if err := produce(ctx, cl, "start", starts); err != nil {
		return err
	}
	return produce(ctx, cl, "cancel", cancels)
}

// produce waits for every acknowledgement, so a zero exit status means every
// request is durably in Kafka.
func produce(ctx context.Context, cl *kgo.Client, what string, recs []*kgo.Record) error {
	var failed error
	for _, r := range cl.ProduceSync(ctx, recs...) {
		if r.Err != nil {
			failed = errors.Join(failed, fmt.Errorf("%s %s: %w", what, r.Record.Key, r.Err))
			continue
		}
		fmt.Printf("%s %s -> partition %d offset %d\n", what, r.Record.Key, r.Record.Partition, r.Record.Offset)
	}
	return failed
}
