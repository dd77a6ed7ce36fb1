// Command check decodes Kubernetes manifests strictly into the k8s.io/api types: an unknown or
// misspelled field, a duplicate key or a value of the wrong type is an error naming the
// document. It prints, as JSON, each document's kind and name and every ConfigMap's data, for
// the caller to check further (baton's test parses the host config it carries).
//
//	go run . ../baton.yaml
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

type document struct {
	Kind string            `json:"kind"`
	Name string            `json:"name"`
	Data map[string]string `json:"data,omitempty"`
	// A StatefulSet's: how long a pod may take to stop, and the HTTP paths of its containers'
	// liveness and readiness probes, and whether they have a preStop hook.
	GraceSeconds *int64 `json:"grace_seconds,omitempty"`
	Liveness     string `json:"liveness,omitempty"`
	Readiness    string `json:"readiness,omitempty"`
	PreStop      bool   `json:"pre_stop,omitempty"`
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: check MANIFESTS.yaml")
		os.Exit(2)
	}
	text, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var out []document
	for i, doc := range bytes.Split(text, []byte("\n---\n")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			fail(i, err)
		}
		var obj interface{ GetName() string }
		var data map[string]string
		d := document{Kind: meta.Kind}
		switch meta.APIVersion + " " + meta.Kind {
		case "v1 ConfigMap":
			cm := &corev1.ConfigMap{}
			decode(i, doc, cm)
			obj, data = cm, cm.Data
		case "v1 Service":
			s := &corev1.Service{}
			decode(i, doc, s)
			obj = s
		case "apps/v1 StatefulSet":
			s := &appsv1.StatefulSet{}
			decode(i, doc, s)
			obj = s
			d.GraceSeconds = s.Spec.Template.Spec.TerminationGracePeriodSeconds
			for _, c := range s.Spec.Template.Spec.Containers {
				if p := c.LivenessProbe; p != nil && p.HTTPGet != nil {
					d.Liveness = p.HTTPGet.Path
				}
				if p := c.ReadinessProbe; p != nil && p.HTTPGet != nil {
					d.Readiness = p.HTTPGet.Path
				}
				d.PreStop = d.PreStop || (c.Lifecycle != nil && c.Lifecycle.PreStop != nil)
			}
		default:
			fail(i, fmt.Errorf("unexpected kind %q of %q", meta.Kind, meta.APIVersion))
		}
		d.Name, d.Data = obj.GetName(), data
		out = append(out, d)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func decode(i int, doc []byte, into any) {
	if err := yaml.UnmarshalStrict(doc, into); err != nil {
		fail(i, err)
	}
}

func fail(i int, err error) {
	fmt.Fprintf(os.Stderr, "document %d: %v\n", i+1, err)
	os.Exit(1)
}
